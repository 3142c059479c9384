"""Compute-node journal records and their idempotent ingest into the ledger."""

import multiprocessing as mp

import pytest

from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table


@pytest.fixture
def job_env(monkeypatch):
    monkeypatch.setenv("HPCTRAIN_JOB_ID", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.jobs.record({"name": "a", "site": "dev"})
        yield ledger


def test_record_carries_job_context_and_no_temp_files_remain(tmp_path, job_env):
    journal = Journal(tmp_path / "j")
    journal.write("event", message="hello")
    (name, rec), = list(journal.records())
    assert rec["kind"] == "event" and rec["message"] == "hello"
    assert (rec["job_id"], rec["slurm_job_id"], rec["task_index"], rec["restart"]) == (1, "4242", 3, 2)
    assert [p.name for p in (tmp_path / "j").iterdir()] == [name]


def test_ingest_is_exactly_once(tmp_path, job_env, ledger):
    journal = Journal(tmp_path / "j")
    journal.write("checkpoint", step=10, path="/ck/step_10", state="committed", bytes=123)
    journal.write("metrics", step=10, values={"loss": 2.5, "lr": 1e-3})
    journal.write("shard_quarantined", message="truncated tar", shard="shard-0003.tar")
    assert ingest_journal(ledger, journal) == 3
    assert ingest_journal(ledger, journal) == 0
    (ck,) = ledger.checkpoints.of_job(1)
    assert (ck["job_id"], ck["task_index"], ck["step"], ck["state"]) == (1, 3, 10, "committed")
    assert {(m["name"], m["value"], m["attempt"]) for m in ledger.metrics.of_job(1)} == {("loss", 2.5, 2), ("lr", 1e-3, 2)}
    (ev,) = ledger.events.of_job(1)
    assert ev["kind"] == "shard_quarantined" and '"shard": "shard-0003.tar"' in ev["data_json"]


def test_checkpoint_state_change_updates_the_same_row(tmp_path, job_env, ledger):
    journal = Journal(tmp_path / "j")
    journal.write("checkpoint", step=10, path="/ck/step_10", state="committed")
    journal.write("checkpoint", step=10, path="/ck/step_10", state="corrupt", note="chunk checksum mismatch")
    ingest_journal(ledger, journal)
    (ck,) = ledger.checkpoints.of_job(1)
    assert (ck["state"], ck["note"]) == ("corrupt", "chunk checksum mismatch")


def test_unreadable_and_malformed_records_become_events(tmp_path, job_env, ledger):
    journal = Journal(tmp_path / "j")
    journal.write("metrics", step=1)  # no values
    (tmp_path / "j" / "99999999999999999999-x-1-0-event.json").write_text("{not json")
    assert ingest_journal(ledger, journal) == 2
    kinds = sorted(e["kind"] for e in Table(ledger, "events").rows())
    assert kinds == ["journal_error", "unreadable"]


def test_a_record_refused_midway_leaves_nothing_of_itself_and_stops_no_later_one(tmp_path, job_env, ledger,
                                                                                   monkeypatch):
    """A utilization record whose GPU rows are written before its timeline is refused, and a checkpoint the schema
    refuses (no path): each one journal_error event, none of their rows, and the records after them ingested."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    journal = Journal(tmp_path / "j")
    summary = {"samples": 3, "seconds": 30.0, "mean": 50.0}
    journal.write("utilization", source="cpu", gpus={"0": summary}, policy={}, timeline=[[0.0, "0", None, None]])
    journal.write("checkpoint", step=10, path=None, state="committed")
    journal.write("checkpoint", step=20, path="/ck/step_20", state="committed")
    assert ingest_journal(ledger, journal) == 3
    assert ledger.gpus.of_job(1) == [] and [c["step"] for c in ledger.checkpoints.of_job(1)] == [20]
    errors = [e for e in Table(ledger, "events").rows() if e["kind"] == "journal_error"]
    assert len(errors) == 2 and any("IntegrityError" in e["message"] for e in errors), errors


def _ingest(db: str, jdir: str) -> None:
    with Ledger(db) as ledger:
        ingest_journal(ledger, Journal(jdir))


def test_concurrent_ingests_fold_each_record_once(tmp_path, job_env, ledger):
    journal = Journal(tmp_path / "j")
    for i in range(60):
        journal.write("progress", message=f"m{i}")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_ingest, args=(str(ledger.path), str(journal.dir))) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert sorted(e["message"] for e in ledger.events.of_job(1)) == sorted(f"m{i}" for i in range(60))


def test_trainer_starts_steps_and_hangs_fold_into_segments(tmp_path, job_env, ledger, monkeypatch):
    journal = Journal(tmp_path / "j")
    journal.write("startup", resumed_from=0, tier=None, times={"main": 10.0, "loaded": 12.0, "first_step": 13.0})
    for step in (1, 2, 3):
        journal.write("metrics", step=step, values={"loss": 1.0, "step_time_s": 0.5})
    journal.write("hang", message="hung in phase step")
    monkeypatch.setenv("HPCTRAIN_STEP_RESTART", "1")
    journal.write("startup", resumed_from=2, tier="memory", times={"main": 20.0, "loaded": 21.0, "first_step": 22.0})
    journal.write("metrics", step=3, values={"loss": 1.0, "step_time_s": 0.25})
    assert ingest_journal(ledger, journal) == 7 and ingest_journal(ledger, journal) == 0  # each record once
    rows = [{k: r[k] for k in ("task_index", "attempt", "step_restart", "main_at", "loaded_at", "resumed_from", "tier",
                               "steps", "step_seconds", "last_step", "hung")} for r in ledger.segments.of_jobs([1])]
    assert rows == [
        {"task_index": 3, "attempt": 2, "step_restart": 0, "main_at": 10.0, "loaded_at": 12.0, "resumed_from": 0,
         "tier": None, "steps": 3, "step_seconds": 1.5, "last_step": 3, "hung": 1},
        {"task_index": 3, "attempt": 2, "step_restart": 1, "main_at": 20.0, "loaded_at": 21.0, "resumed_from": 2,
         "tier": "memory", "steps": 1, "step_seconds": 0.25, "last_step": 3, "hung": 0}]
