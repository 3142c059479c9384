"""`hpctrain ledger archive|vacuum`: old jobs move, with every row of theirs, into an archive ledger; nothing is lost
or duplicated, a submission or sweep still running stays whole, and the file shrinks once vacuumed."""

from __future__ import annotations

import os
import shutil
import sqlite3
import time
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.ledger import DAY, make_history

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.archive import JOB_TABLES, archive, vacuum
from hpctrain.ledger.table import Table

TABLES = ("sweeps", "jobs", *JOB_TABLES)


def counts(path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in TABLES}


@pytest.fixture
def history(tmp_path):
    path, now = tmp_path / "ledger.db", time.time()
    make_history(path, jobs=3000, sweeps=30, metric_rows=30_000, now=now, days=365)
    return path, now


def test_old_jobs_move_whole_and_nothing_is_lost(history, tmp_path):
    path, now = history
    before, cutoff = counts(path), now - 180 * DAY
    with Ledger(path) as ledger:
        # a submission of two chunks, one ended long ago and one still running: both stay
        old, running = ledger.db.execute("SELECT min(id), max(id) FROM jobs").fetchone()
        ledger.db.execute("UPDATE jobs SET group_id = ? WHERE id = ?", [old, running])
        done = archive(ledger, tmp_path / "archive.db", cutoff)
        kept = {r["id"]: r for r in Table(ledger, "jobs").rows()}
    moved = counts(tmp_path / "archive.db")
    assert done.jobs == moved["jobs"] > 1000 and old in kept
    assert {t: counts(path)[t] + moved[t] for t in TABLES} == before
    assert all(r["ended_at"] is None or r["ended_at"] >= cutoff or r["id"] == old for r in kept.values())
    with sqlite3.connect(tmp_path / "archive.db") as conn:
        assert conn.execute("SELECT max(ended_at) FROM jobs").fetchone()[0] < cutoff
        orphans = conn.execute("SELECT count(*) FROM attempts WHERE job_id NOT IN (SELECT id FROM jobs)").fetchone()[0]
    assert orphans == 0
    with Ledger(path) as ledger:  # a second run finds nothing more to move
        assert archive(ledger, tmp_path / "archive.db", cutoff).jobs == 0
    assert counts(tmp_path / "archive.db") == moved


def test_a_run_stopped_between_copy_and_delete_is_finished_by_the_next(history, tmp_path):
    path, now = history
    target = tmp_path / "archive.db"
    with Ledger(path) as ledger:
        archive(ledger, target, now - 300 * DAY)
    # as if the first run had stopped after its copy: the same rows are in both files again
    with sqlite3.connect(target) as conn:
        conn.execute("ATTACH DATABASE ? AS live", [str(path)])
        conn.execute("INSERT INTO live.sweeps SELECT * FROM sweeps")
        conn.execute("INSERT INTO live.jobs SELECT * FROM jobs")
        for table in JOB_TABLES:
            conn.execute(f"INSERT INTO live.{table} SELECT * FROM {table}")
    total = {t: counts(path)[t] + counts(target)[t] for t in TABLES}
    with Ledger(path) as ledger:
        archive(ledger, target, now - 300 * DAY)
    assert {t: counts(path)[t] + counts(target)[t] for t in TABLES} == {
        t: total[t] - counts(target)[t] for t in TABLES}


def test_the_archive_of_another_ledger_is_refused(history, tmp_path):
    path, now = history
    other = tmp_path / "other.db"
    make_history(other, jobs=500, sweeps=5, metric_rows=1000, now=now - 1000, days=365, seed=1)
    before = counts(path), counts(other)
    with Ledger(path) as ledger, pytest.raises(HpctrainError, match=r"holds \d+ other \w+ rows under the same keys: the archive of another ledger\? Nothing was moved"):
        archive(ledger, other, now - 180 * DAY)
    assert (counts(path), counts(other)) == before


def test_an_archive_the_disk_cannot_hold_is_refused_first(history, tmp_path, monkeypatch):
    """Half of a ledger's jobs moved write about 1.5 times its size (the archive, its WAL, the ledger's WAL)."""
    path, now = history
    before = counts(path)
    size = path.stat().st_size
    monkeypatch.setattr(shutil, "disk_usage", lambda d: shutil._ntuple_diskusage(10 * size, 9 * size, size))
    with Ledger(path) as ledger, pytest.raises(HpctrainError, match=r"archiving [\d,]+ jobs needs about .* GiB free"
                                                                    r" there, .* GiB is: nothing was moved"):
        archive(ledger, tmp_path / "archive.db", now - 180 * DAY)
    assert counts(path) == before and counts(tmp_path / "archive.db")["jobs"] == 0


def test_the_ledger_makes_its_planner_statistics(history):
    """A ledger without statistics (never analysed, as before schema v15) gets them when opened; archive and vacuum
    make them again for what remains."""
    path, now = history
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE sqlite_stat1")
    with Ledger(path) as ledger:
        analysed = {r[0] for r in ledger.db.execute("SELECT tbl FROM sqlite_stat1")}
    assert {"jobs", "attempts", "metrics", "events"} <= analysed


def test_the_cli_archives_then_vacuums(history, tmp_path):
    path, _ = history
    env = {"HPCTRAIN_LEDGER": str(path)}
    out = run_cli("ledger", "archive", "--older-than", "200", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("moved ") and str(tmp_path / "ledger-archive.db") in out.stdout
    size = path.stat().st_size
    out = run_cli("ledger", "vacuum", env=env)
    assert out.returncode == 0, out.stderr
    assert path.stat().st_size < 0.7 * size
    out = run_cli("ledger", "archive", "--to", str(path), env=env)
    assert out.returncode == 2 and out.stderr.startswith("hpctrain: error: ") and "another file" in out.stderr
    with Ledger(path) as ledger:
        assert vacuum(ledger)[1] <= path.stat().st_size


def test_registered_and_evaluated_jobs_stay_with_what_they_reference(tmp_path):
    """A job with a model version stays, and its evaluation job with it; an evaluated job and its evaluation job
    move together, the evaluation's row too; a job that was exported moves with its export row."""
    from helpers.registry import evaluated, job_with_checkpoints

    from hpctrain.registry.versions import register

    path, long_ago = tmp_path / "ledger.db", time.time() - 400 * DAY
    with Ledger(path) as ledger:
        kept, moved = (job_with_checkpoints(ledger, tmp_path, name, (5,)) for name in ("kept", "moved"))
        evals = [Table(ledger, "jobs").insert({"name": f"{n}-eval", "site": "dev", "state": "COMPLETED"})
                 for n in ("kept", "moved")]
        for job, eval_job in zip((kept, moved), evals):
            ledger.evaluations.request(job, -1, 5, "heldout", "ck")
            ledger.evaluations.submitted(job, -1, 5, "heldout", eval_job)
            evaluated(ledger, job, 5, 2.0)
        ledger.exports.sent("mlflow:x", moved, -1, "run", 0, "COMPLETED")
        register(ledger, "gpt", kept)
        ledger.db.execute("UPDATE jobs SET ended_at = ?", [long_ago])
        done = archive(ledger, tmp_path / "archive.db", time.time())
        left = {r["id"] for r in Table(ledger, "jobs").rows()}
        assert done.jobs == 2 and left == {kept, evals[0]}
        assert [e["job_id"] for e in Table(ledger, "evaluations").rows()] == [kept]
        assert ledger.registry.versions("gpt")[0]["job_id"] == kept
    with Ledger(tmp_path / "archive.db") as archived:
        assert [e["job_id"] for e in archived.evaluations.of_job(moved)] == [moved]
        assert archived.exports.get("mlflow:x", moved, -1) is not None


def _job_with_rows(ledger, name: str, ended_at: float | None) -> int:
    """A job with one run, one checkpoint and one event: a row in each table whose ids the ledger gives."""
    job = Table(ledger, "jobs").insert({"name": name, "site": "dev", "state": "COMPLETED", "ended_at": ended_at})
    _more_rows(ledger, job, 0)
    return job


def _more_rows(ledger, job: int, attempt: int) -> None:
    Table(ledger, "attempts").insert({"job_id": job, "attempt": attempt, "state": "COMPLETED"})
    Table(ledger, "checkpoints").insert({"job_id": job, "step": attempt, "path": f"/ckpt/{job}/{attempt}",
                                         "state": "committed", "created_at": 1.0})
    ledger.event("launch", f"run {attempt}", job)


def of_job(path, job: int) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return {t: conn.execute(f"SELECT count(*) FROM {t} WHERE job_id = ?", [job]).fetchone()[0]
                for t in ("attempts", "checkpoints", "events")}


def test_the_ids_an_archive_moved_out_are_never_given_again(tmp_path):
    """Issue 56.1: the old job's rows held each table's highest ids; once archived, SQLite gave them to the running
    job's next rows, and the next archive into the same file skipped those as held and deleted them."""
    path, target, long_ago = tmp_path / "ledger.db", tmp_path / "archive.db", time.time() - 400 * DAY
    with Ledger(path) as ledger:
        running = _job_with_rows(ledger, "running", None)
        old = _job_with_rows(ledger, "old", long_ago)
        assert archive(ledger, target, time.time() - DAY).jobs == 1
        _more_rows(ledger, running, 1)
        assert Table(ledger, "jobs").insert({"name": "new", "site": "dev", "state": "PENDING"}) > old
        ledger.db.execute("UPDATE jobs SET ended_at = ? WHERE id = ?", [long_ago, running])
        assert archive(ledger, target, time.time() - DAY).jobs == 1
    assert of_job(target, running) == {"attempts": 2, "checkpoints": 2, "events": 2}
    assert of_job(target, old) == {"attempts": 1, "checkpoints": 1, "events": 1}
    assert of_job(path, running) == of_job(path, old) == {"attempts": 0, "checkpoints": 0, "events": 0}


def _plant(target, table: str, row: dict) -> None:
    """A row put into the archive as an archive made before schema v18 may hold it (foreign keys not checked)."""
    with Ledger(target):
        pass
    with sqlite3.connect(target) as conn:
        conn.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))
    conn.close()


def snapshot(path, tables=TABLES, columns: dict[str, list[str]] | None = None) -> dict[str, list[tuple]]:
    """Every row of ``tables`` (of their ``columns`` only when given: a later migration may add some)."""
    with sqlite3.connect(path) as conn:
        held = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {t: conn.execute(f"SELECT {', '.join((columns or {}).get(t, ['*']))} FROM {t} ORDER BY 1, 2").fetchall()
                for t in tables if t in held}


def test_an_archive_holding_another_row_under_an_id_is_refused_naming_the_table(tmp_path):
    path, target, long_ago = tmp_path / "ledger.db", tmp_path / "archive.db", time.time() - 400 * DAY
    with Ledger(path) as ledger:
        job = _job_with_rows(ledger, "old", long_ago)
        (attempt,) = ledger.db.execute("SELECT id FROM attempts").fetchone()
    _plant(target, "attempts", {"id": attempt, "job_id": 999, "attempt": 0, "state": "FAILED"})
    before = snapshot(path), snapshot(target)
    with Ledger(path) as ledger, pytest.raises(HpctrainError, match=r"holds 1 other attempts rows under the same keys"):
        archive(ledger, target, time.time())
    assert (snapshot(path), snapshot(target)) == before
    assert of_job(path, job) == {"attempts": 1, "checkpoints": 1, "events": 1}


def test_a_row_the_archive_would_not_take_is_not_deleted(tmp_path):
    """A checkpoint whose path the archive holds under another id is not copied (the path is unique): it stays,
    with the rest, and one line says how many rows of which table."""
    path, target, long_ago = tmp_path / "ledger.db", tmp_path / "archive.db", time.time() - 400 * DAY
    with Ledger(path) as ledger:
        job = _job_with_rows(ledger, "old", long_ago)
        (ckpt_path,) = ledger.db.execute("SELECT path FROM checkpoints").fetchone()
    _plant(target, "checkpoints", {"id": 1000, "job_id": 999, "step": 5, "path": ckpt_path, "state": "committed",
                                   "created_at": 2.0})
    before = snapshot(path)
    with Ledger(path) as ledger, pytest.raises(HpctrainError, match=r": 1 checkpoints rows to move are not in the "
                                                                    r"archive as they are here .*nothing was deleted"):
        archive(ledger, target, time.time())
    assert snapshot(path) == before and of_job(path, job) == {"attempts": 1, "checkpoints": 1, "events": 1}


def test_the_ledger_gives_ids_above_those_an_archive_holds(tmp_path):
    """An archive made before schema v18 may hold ids above the ledger's highest: archiving into it raises them."""
    path, target = tmp_path / "ledger.db", tmp_path / "archive.db"
    _plant(target, "jobs", {"id": 500, "name": "gone", "site": "dev"})
    _plant(target, "attempts", {"id": 700, "job_id": 500, "attempt": 0})
    with Ledger(path) as ledger:
        archive(ledger, target, time.time())
        job = Table(ledger, "jobs").insert({"name": "new", "site": "dev"})
        attempt = Table(ledger, "attempts").insert({"job_id": job, "attempt": 0})
    assert (job, attempt) == (501, 701)


@pytest.mark.parametrize("to", ["ledger.db", "ledger.db-wal", "ledger.db-shm", "ledger.db-journal", "sub/../ledger.db",
                                "hard link to the ledger", "hard link to its WAL", "symbolic link to its WAL"])
def test_an_archive_onto_a_file_sqlite_keeps_the_ledger_in_is_refused(tmp_path, to):
    """Issue 57.2: the archive made where SQLite keeps the ledger's WAL zeroed the ledger's pages."""
    path, long_ago = tmp_path / "ledger.db", time.time() - 400 * DAY
    with Ledger(path) as ledger:
        _job_with_rows(ledger, "old", long_ago)
        assert ledger.storage.journal_mode == "wal" and Path(f"{path}-wal").exists()
        target = tmp_path / to
        if to.startswith("hard link"):
            os.link(Path(f"{path}-wal") if "WAL" in to else path, target := tmp_path / "link.db")
        elif to.startswith("symbolic"):
            (target := tmp_path / "link.db").symlink_to(f"{path}-wal")
        existed, before = target.exists(), snapshot(path)
        with pytest.raises(HpctrainError, match=r"the archive must be another file than the ledger and the files "
                                                r"SQLite keeps it in \(.* would be .*\)$"):
            archive(ledger, target, time.time())
        assert target.exists() == existed
    assert snapshot(path) == before


def test_the_upgrade_to_ids_given_once_keeps_every_row_index_and_trigger(tmp_path):
    """The migration that makes ids AUTOINCREMENT rebuilds jobs, attempts, checkpoints and events: a ledger from
    before it keeps its rows, indexes and triggers (those are a fresh ledger's), and an id freed is not given again."""
    from hpctrain.ledger.schema import MIGRATIONS

    before = next(i for i, steps in enumerate(MIGRATIONS) if any(callable(s) for s in steps))
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        for steps in MIGRATIONS[:before]:
            for statement in steps:
                conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {before}")
        conn.execute("INSERT INTO jobs (id, name, site, state) VALUES (3, 'a', 'dev', 'RUNNING'), (9, 'b', 'dev', 'NEW')")
        conn.execute("INSERT INTO attempts (id, job_id, attempt) VALUES (4, 3, 0), (7, 9, 0)")
        conn.execute("INSERT INTO events (id, time, kind, job_id) VALUES (5, 1.0, 'submitted', 9)")
        columns = {"jobs": [c[1] for c in conn.execute("PRAGMA table_info(jobs)")]}  # v27 adds one
    conn.close()
    rows = snapshot(path)
    with Ledger(path) as ledger:
        assert snapshot(path, rows, columns) == rows  # the tables and columns it had (later migrations add some)
        ledger.db.execute("DELETE FROM attempts WHERE id = 7")
        ledger.db.execute("DELETE FROM events")
        assert Table(ledger, "attempts").insert({"job_id": 9, "attempt": 1}) == 8
        assert ledger.event("launch", "", 9) == 6
        ledger.db.execute("UPDATE attempts SET requeued = 1 WHERE id = 8")  # a trigger of attempts' still runs
        assert ledger.db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert ledger.db.execute("PRAGMA foreign_key_check").fetchall() == []
        upgraded = set(ledger.db.execute("SELECT type, name FROM sqlite_master"))
    with Ledger(tmp_path / "new.db") as ledger:
        assert set(ledger.db.execute("SELECT type, name FROM sqlite_master")) == upgraded
