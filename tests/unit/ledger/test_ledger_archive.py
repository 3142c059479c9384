"""`hpctrain ledger archive|vacuum`: old jobs move, with every row of theirs, into an archive ledger; nothing is lost
or duplicated, a submission or sweep still running stays whole, and the file shrinks once vacuumed."""

from __future__ import annotations

import shutil
import sqlite3
import time

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
    with Ledger(path) as ledger, pytest.raises(HpctrainError, match="other jobs under the same ids"):
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
        ledger.exports.sent("mlflow:x", moved, -1, "run", 0, 0.0, "COMPLETED")
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
