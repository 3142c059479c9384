"""The ledger: schema, migrations, WAL and concurrent writers from several processes."""

import multiprocessing as mp
import sqlite3

import pytest

from hpctrain.errors import LedgerError
from hpctrain.ledger import SCHEMA_VERSION, Ledger

TABLES = {"jobs", "array_tasks", "attempts", "checkpoints", "metrics", "sweeps", "events"}


def test_new_ledger_has_schema_wal_and_busy_timeout(tmp_path):
    with Ledger(tmp_path / "sub" / "l.db") as ledger:
        assert ledger.schema_version == SCHEMA_VERSION
        assert TABLES <= set(ledger.db.table_names())
        assert ledger.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert ledger.db.execute("PRAGMA busy_timeout").fetchone()[0] >= 30_000


def test_reopen_keeps_rows_and_does_not_remigrate(tmp_path):
    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        job = ledger.insert("jobs", {"name": "a", "site": "dev", "spec_json": {"lr": 0.1}})
    with Ledger(path) as ledger:
        assert ledger.get("jobs", job)["spec_json"] == '{"lr": 0.1}'
        assert ledger.schema_version == SCHEMA_VERSION


def test_old_database_is_migrated(tmp_path):
    path = tmp_path / "l.db"
    sqlite3.connect(path).close()  # version 0: an empty file
    with Ledger(path) as ledger:
        assert ledger.schema_version == SCHEMA_VERSION


def test_newer_schema_is_refused_with_one_line(tmp_path):
    path = tmp_path / "l.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(LedgerError) as info:
        Ledger(path)
    assert str(info.value) == (
        f"{path}: ledger schema v{SCHEMA_VERSION + 1} is newer than this hpctrain (v{SCHEMA_VERSION}): upgrade hpctrain"
    )


def test_not_a_database_is_a_clear_error(tmp_path):
    path = tmp_path / "l.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LedgerError, match=r"cannot open ledger: file is not a database"):
        Ledger(path)


def test_transaction_rolls_back_on_error(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(RuntimeError):
            with ledger.transaction():
                ledger.insert("jobs", {"name": "a", "site": "dev"})
                raise RuntimeError("boom")
        assert ledger.rows("jobs") == []


def test_nested_transaction_is_one_commit(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        with ledger.transaction():
            ledger.insert("jobs", {"name": "a", "site": "dev"})
            ledger.update("jobs", 1, {"state": "PENDING"})
            ledger.event("submitted", "job a", job_id=1, sbatch_calls=1)
        assert ledger.get("jobs", 1)["state"] == "PENDING"
        (event,) = ledger.rows("events")
        assert event["kind"] == "submitted" and event["data_json"] == '{"sbatch_calls": 1}'


def test_metrics_upsert_is_idempotent(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        job = ledger.insert("jobs", {"name": "a", "site": "dev"})
        for value in (1.0, 0.5):
            ledger.upsert("metrics", {"job_id": job, "task_index": -1, "name": "loss", "step": 10, "value": value},
                          pk=("job_id", "task_index", "name", "step"))
        assert [r["value"] for r in ledger.rows("metrics")] == [0.5]


def _writer(path: str, worker: int, n: int) -> None:
    ledger = Ledger(path)
    for i in range(n):
        with ledger.transaction():  # read-then-write, the pattern that fails without BEGIN IMMEDIATE
            count = ledger.db.execute("SELECT count(*) FROM events").fetchone()[0]
            ledger.event("load", f"{worker}:{i}", seen=count)
    ledger.close()


def test_concurrent_processes_lose_no_rows(tmp_path):
    path = str(tmp_path / "l.db")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 150)) for w in range(4)]  # also races the first migration
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    with Ledger(path) as ledger:
        messages = {r["message"] for r in ledger.rows("events")}
    assert messages == {f"{w}:{i}" for w in range(4) for i in range(150)}


def test_summaries_count_runs_requeued_on_a_preemption_notice_as_preempted(tmp_path):
    """Slurm records PREEMPTED only for a run it stopped; one that checkpointed on the notice and requeued
    itself ends REQUEUED (or COMPLETED) with cause "preemption": both are preemptions, a time limit is not."""
    with Ledger(tmp_path / "l.db") as ledger:
        job = ledger.jobs.record({"name": "a", "site": "dev"})
        for attempt, state, cause in ((1, "PREEMPTED", "preemption"), (2, "REQUEUED", "preemption"),
                                      (3, "COMPLETED", "preemption"), (4, "REQUEUED", "timeout"), (5, "RUNNING", None)):
            ledger.attempts.record(job, -1, attempt, state=state, cause=cause)
        (row,) = ledger.jobs.summaries("dev", final=())
    assert (row["restarts"], row["preemptions"]) == (4, 3)
