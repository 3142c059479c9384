"""The ledger: schema, migrations, WAL and concurrent writers from several processes."""

import contextlib
import multiprocessing as mp
import sqlite3
import subprocess
import sys

import pytest

from hpctrain.errors import LedgerError
from hpctrain.ledger import SCHEMA_VERSION, Ledger, rows
from hpctrain.ledger.table import Table

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
        job = ledger.jobs.record({"name": "a", "site": "dev", "spec_json": {"lr": 0.1}})
    with Ledger(path) as ledger:
        assert ledger.jobs.known(job)["spec_json"] == '{"lr": 0.1}'
        assert ledger.schema_version == SCHEMA_VERSION


def test_session_dirs_are_those_of_jobs_whose_spec_is_a_session(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        ids = [ledger.jobs.record({"name": n, "site": "dev", "spec_json": spec}) for n, spec in (
            ("batch", {"interactive": None}), ("lab", {"interactive": {"idle_minutes": 5}}), ("old", None),
            ("unsent", {"interactive": {}}))]
        for job_id in ids[:3]:
            ledger.jobs.set_script(job_id, "/jobs/job.sh", f"/jobs/{job_id}", "0" * 64)
        assert ledger.jobs.session_dirs(ids) == {ids[1]: f"/jobs/{ids[1]}"}
        assert ledger.jobs.session_dirs(ids[:1]) == {}


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


def test_a_second_ledger_on_the_file_keeps_the_first_ones_locks(tmp_path):
    """Two ledgers on one file in one process (the executor's watcher keeps one for the process's life): opening the
    second must not drop the locks SQLite holds for the first (closing any descriptor of a file drops them all), or a
    peer's closing connection takes itself for the last and deletes the WAL under the first: its writes are lost."""
    path = tmp_path / "l.db"
    peer = [sys.executable, "-c", f"import sqlite3; sqlite3.connect({str(path)!r}).execute('SELECT 1 FROM jobs').close()"]
    with Ledger(path) as first:
        first.jobs.record({"name": "a", "site": "dev"})
        with Ledger(path) as second:
            assert second.jobs.get(1)["name"] == "a"
        subprocess.run(peer, check=True)
        assert path.with_name("l.db-wal").exists()
        first.jobs.record({"name": "b", "site": "dev"})
    with Ledger(path) as reopened:
        assert [reopened.jobs.get(i)["name"] for i in (1, 2)] == ["a", "b"]
        assert reopened.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_transaction_rolls_back_on_error(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(RuntimeError):
            with ledger.transaction():
                ledger.jobs.record({"name": "a", "site": "dev"})
                raise RuntimeError("boom")
        assert ledger.jobs.get(1) is None


def test_nested_transaction_is_one_commit(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        with ledger.transaction():
            ledger.jobs.record({"name": "a", "site": "dev"})
            ledger.jobs.set_state(1, "PENDING")
            ledger.event("submitted", "job a", job_id=1, sbatch_calls=1)
        assert ledger.jobs.known(1)["state"] == "PENDING"
        (event,) = ledger.events.of_job(1)
        assert event["kind"] == "submitted" and event["data_json"] == '{"sbatch_calls": 1}'


def test_metrics_upsert_is_idempotent(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        job = ledger.jobs.record({"name": "a", "site": "dev"})
        for value in (1.0, 0.5):
            ledger.metrics.record(job, -1, 10, {"loss": value}, restart=0, at=0.0)
        assert [r["value"] for r in ledger.metrics.of_job(job)] == [0.5]


def _writer(path: str, worker: int, n: int) -> None:
    """Odd workers write from inside `Ledger.reading`, as status and the tick do: a read transaction that
    upgraded to a write would be refused ("database is locked", no waiting) while another process writes."""
    ledger = Ledger(path)
    for i in range(n):
        with ledger.reading() if worker % 2 else contextlib.nullcontext():
            ledger.db.execute("SELECT count(*) FROM jobs").fetchone()
            with ledger.transaction():  # read-then-write, the pattern that fails without BEGIN IMMEDIATE
                count = ledger.db.execute("SELECT count(*) FROM events").fetchone()[0]
                ledger.event("load", f"{worker}:{i}", seen=count)
            ledger.db.execute("SELECT count(*) FROM events").fetchone()
    ledger.close()


def test_a_write_inside_reading_commits_at_once_and_reading_goes_on(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger, Ledger(tmp_path / "l.db") as other:
        with ledger.reading():
            assert ledger.db.conn.in_transaction
            with ledger.transaction():
                ledger.event("a", "written inside a read")
            assert ledger.db.conn.in_transaction  # reading again
            assert [r["kind"] for r in Table(other, "events").rows()] == ["a"]  # committed, not held
        assert not ledger.db.conn.in_transaction


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
        messages = {r["message"] for r in Table(ledger, "events").rows()}
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


def test_interruptions_of_jobs_alike_count_runs_that_lost_work_over_their_running_time(tmp_path):
    """What checkpoints every "auto" steps learn from at submit: the runs ended lately of jobs in the same partition
    and QOS on as many GPUs; failed or hung ones, and runs preempted without a word, lose work; a preemption whose
    notice saved (issue 56.11), a time limit or a completion does not; and so does each job step restarted in place
    (what the memory tier's "auto" learns from, counted apart)."""
    with Ledger(tmp_path / "l.db") as ledger:
        alike = ledger.jobs.record({"name": "a", "site": "dev", "partition": "gpu", "qos": "low"})
        for attempt, state, cause, ran in ((0, "PREEMPTED", None, 3600), (1, "REQUEUED", "preemption", 1800),
                                           (2, "TIMEOUT", "timeout", 7200), (3, "FAILED", "hang", 600),
                                           (4, "COMPLETED", "completed", 900), (5, "NODE_FAIL", None, 300)):
            ledger.attempts.record(alike, -1, attempt, state=state, cause=cause, alloc_gpus=8, started_at=10_000.0,
                                   ended_at=10_000.0 + ran)
        ledger.attempts.record(alike, -1, 6, state="PREEMPTED", alloc_gpus=8, started_at=10.0, ended_at=100.0)  # old
        other_qos = ledger.jobs.record({"name": "b", "site": "dev", "partition": "gpu", "qos": "normal"})
        ledger.attempts.record(other_qos, -1, 0, state="PREEMPTED", alloc_gpus=8, started_at=10_000.0, ended_at=11_000.0)
        smaller = ledger.jobs.record({"name": "c", "site": "dev", "partition": "gpu", "qos": "low"})
        ledger.attempts.record(smaller, -1, 0, state="PREEMPTED", alloc_gpus=4, started_at=10_000.0, ended_at=11_000.0)
        for restart in (0, 1, 2):  # run 4 restarted its job step twice in place before it completed
            ledger.segments.started({"job_id": alike, "task_index": -1, "attempt": 4, "step_restart": restart},
                                    main_at=None, loaded_at=None, resumed_from=0, tier=None)
        assert ledger.attempts.interruptions("dev", "gpu", "low", 8, since=5_000.0) == (5, 2, 14400.0)
        assert ledger.attempts.interruptions("dev", "cpu", "low", 8, since=5_000.0) == (0, 0, 0.0)


ROW_TYPES = {"jobs": rows.JobRow, "array_tasks": rows.ArrayTaskRow, "attempts": rows.AttemptRow,
             "checkpoints": rows.CheckpointRow, "metrics": rows.MetricRow, "sweeps": rows.SweepRow,
             "trials": rows.TrialRow, "events": rows.EventRow, "segments": rows.SegmentRow,
             "site_cache": rows.SiteCacheRow, "journal_ingested": rows.IngestedRow,
             "evaluations": rows.EvaluationRow, "registered_models": rows.ModelRow,
             "model_versions": rows.VersionRow, "model_aliases": rows.AliasRow, "alias_moves": rows.AliasMoveRow,
             "tracker_exports": rows.TrackerExportRow, "gpu_use": rows.GpuUseRow, "gpu_timeline": rows.GpuPoint}
WRITE_TYPES = {rows.NewJob: "jobs", rows.JobTimes: "jobs", rows.NewTask: "array_tasks", rows.AttemptFields: "attempts",
               rows.NewCheckpoint: "checkpoints", rows.SegmentKey: "segments"}


def keys(row_type: type) -> set[str]:
    return set(row_type.__required_keys__ | row_type.__optional_keys__)


def test_row_types_are_the_tables_columns(tmp_path):
    """Every table but run_usage, job_usage, usage_minutes, ledger_info, metric_tails, journal_seen,
    sites_to_decide, sites_to_supervise, gpu_runs and gpu_curves (their SQL, packed) and SQLite's own has
    its row type, and what the table classes take are its columns."""
    with Ledger(tmp_path / "l.db") as ledger:
        columns = {t: {c.name for c in ledger.db.table(t).columns} for t in ledger.db.table_names()
                   if not t.startswith("sqlite_")}  # SQLite's own: the planner's statistics
    assert set(columns) == set(ROW_TYPES) | {"run_usage", "job_usage", "usage_minutes", "ledger_info", "metric_tails",
                                              "journal_seen", "sites_to_decide", "sites_to_supervise",
                                              "gpu_runs", "gpu_curves"}
    assert {t: keys(row_type) for t, row_type in ROW_TYPES.items()} == {t: columns[t] for t in ROW_TYPES}
    assert keys(rows.SubmittedJob) == columns["jobs"] and keys(rows.LoggedEvent) == columns["events"] | {"data"}
    assert [t for t, table in WRITE_TYPES.items() if not keys(t) <= columns[table]] == []


def test_query_row_types_are_the_queries_columns(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        job = ledger.jobs.record({"name": "a", "site": "dev", "is_array": 1},
                                 [{"task_index": 0, "param_index": 0, "params_json": "{}"}])
        ledger.attempts.record(job, 0, 0, started_at=1.0, ended_at=2.0)
        ledger.sweeps.create("s", "random", "{}")
        ledger.sweeps.add_trials("s", 0, [{"x": 1}])
        ledger.sweeps.link("s", job, [(0, 0)])
        assert set(ledger.jobs.summaries("dev", ())[0]) == keys(rows.JobSummary)
        assert set(ledger.attempts.usage_of([job], 3.0)[0]) == keys(rows.RunFacts)
        assert set(ledger.sweeps.trials_with_tasks("s")[0]) == keys(rows.TrialTask)
        assert set(ledger.sweeps.table("s")[0]) == keys(rows.TrialSummary)


def test_site_cache_and_events_read_back_what_was_written(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        assert ledger.site_cache.get("dev", "limits") is None
        ledger.site_cache.put("dev", "limits", {"MaxArraySize": "1001"})
        ledger.site_cache.put("dev", "limits", {"MaxArraySize": "2001"})
        row = ledger.site_cache.get("dev", "limits")
        assert row is not None and row["value_json"] == '{"MaxArraySize": "2001"}'
        job = ledger.jobs.record({"name": "a", "site": "dev"})
        ledger.events.add("ranks", "first", job, {"step": 1}, at=10.0)
        ledger.events.add("ranks", "last", job, {"step": 2}, at=20.0)
        ledger.event("other", job_id=job)
        last = ledger.events.last(job, "ranks")
        assert last is not None and (last["message"], last["data"]) == ("last", {"step": 2})
        assert [e["data_json"] for e in ledger.events.of_job(job)] == ['{"step": 1}', '{"step": 2}', None]


def test_an_evaluation_is_asked_for_once_and_keeps_its_last_outcome(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        job = ledger.jobs.record({"name": "a", "site": "dev"})
        assert ledger.evaluations.request(job, -1, 50, "heldout", "/ck/step_00000050")
        assert not ledger.evaluations.request(job, -1, 50, "heldout", "/ck/step_00000050")
        ledger.evaluations.failed(job, -1, 50, "heldout", "evaluator heldout: killed", at=5.0)
        ledger.evaluations.done(job, -1, 50, "heldout", {"eval/loss": 2.5}, at=9.0)  # its requeued run got there
        (row,) = ledger.evaluations.of_job(job)
    assert (row["state"], row["metrics_json"], row["error"], row["done_at"]) == ("done", '{"eval/loss": 2.5}', None, 9.0)


def test_an_evaluation_request_lives_from_requested_to_an_end_and_is_asked_again_once_failed(tmp_path):
    """requested (committed before its sbatch) -> submitted -> failed when its job ended without a result (its
    journal read); a failed or expired request may be asked again, with a new submission key; an open one not."""
    with Ledger(tmp_path / "l.db") as ledger:
        job = ledger.jobs.record({"name": "a", "site": "dev"})
        eval_job = ledger.jobs.record({"name": "a-eval-k1", "site": "dev"})
        assert ledger.evaluations.request(job, -1, 5, "heldout", "/ck", "a-eval-k1", again=("failed", "expired"))
        ledger.evaluations.linked(job, -1, 5, "heldout", eval_job)
        assert not ledger.evaluations.request(job, -1, 5, "heldout", "/ck", "a-eval-k2", again=("failed", "expired"))
        ledger.evaluations.submitted(job, -1, 5, "heldout", eval_job)
        ledger.jobs.set_state(eval_job, "FAILED", ended_at=10.0)
        assert ledger.evaluations.close_ended({"FAILED"}) == []  # its journal not read since its end yet
        ledger.jobs.journals_read([eval_job], 11.0)
        assert ledger.evaluations.close_ended({"FAILED"}) == [(job, -1, 5, "heldout")]
        row = ledger.evaluations.get(job, -1, 5, "heldout")
        assert row is not None and row["state"] == "failed" and "ended FAILED without a result" in row["error"]
        assert ledger.evaluations.request(job, -1, 5, "heldout", "/ck", "a-eval-k2", again=("failed", "expired"))
        row = ledger.evaluations.get(job, -1, 5, "heldout")
        assert row is not None and (row["state"], row["submission_key"], row["eval_job_id"]) == ("requested",
                                                                                                "a-eval-k2", None)
        ledger.evaluations.unsubmitted(job, -1, 5, "heldout", "expired", "killed before sbatch")
        assert ledger.evaluations.get(job, -1, 5, "heldout")["state"] == "expired"


def test_requests_asked_for_before_the_lifecycle_are_submitted_once_they_have_a_job(tmp_path):
    """Migrating: a request with its job becomes submitted; one without stays requested (settled by `eval`)."""
    import sqlite3

    from hpctrain.ledger.schema import MIGRATIONS

    path = tmp_path / "l.db"
    with Ledger(path) as ledger:
        job = ledger.jobs.record({"name": "a", "site": "dev"})
        ledger.evaluations.request(job, -1, 5, "heldout", "/ck")
        ledger.evaluations.request(job, -1, 6, "heldout", "/ck")
        ledger.evaluations.linked(job, -1, 5, "heldout", job)
    (migration,) = [m for m in MIGRATIONS if any("submission_key" in s for s in m if isinstance(s, str))]
    db = sqlite3.connect(path)  # as the migration finds it
    db.execute("UPDATE evaluations SET state = 'requested'")
    db.execute("ALTER TABLE evaluations DROP COLUMN submission_key")
    db.execute("DROP INDEX evaluations_state")
    for statement in migration:
        db.execute(statement)
    db.commit()
    db.close()
    with Ledger(path) as ledger:
        assert [e["state"] for e in ledger.evaluations.of_job(job)] == ["submitted", "requested"]
