"""The requeue policy, the batch script's attempt bookkeeping (`hpctrain attempt start|end`) outside Slurm,
and how attempts reach the ledger. The cluster tests run the same code inside real jobs."""

import json
import os
import signal
import subprocess
import sys

import pytest

from hpctrain.jobs.poll import Poller
from hpctrain.jobs.supervise import supervise
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table
from hpctrain.runtime.attempts import (
    Outcome,
    RunPolicy,
    decide,
    fill_end_steps,
    journal_outcomes,
    latest_committed_step,
    rerun_of_completed,
    stalled_streak,
)
from hpctrain.errors import SlurmError
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.parse import parse_parsable_with_header
from hpctrain.slurm.sacct import histories

from helpers.ledger import traced

POLICY = {"requeue": True, "on_error": True, "max_stalled": 3}


def test_streak_counts_only_the_latest_runs_without_progress():
    runs = [Outcome("preemption", 0, 0), Outcome("preemption", 0, 40), Outcome("error", 40, 40), Outcome("error", 40, 40)]
    assert stalled_streak(runs) == 2
    assert stalled_streak(runs[:2]) == 0
    # Without hpctrain checkpoints progress is unknown: only the job's own failures count.
    assert Outcome("error", None, None).stalled and not Outcome("preemption", None, None).stalled


def test_many_preemptions_with_progress_never_hit_the_cap():
    runs = [Outcome("preemption", 10 * k, 10 * k + 10) for k in range(50)]
    assert decide(runs, **POLICY)[0]


def test_crashing_at_start_stops_after_the_cap_with_the_reason():
    runs = [Outcome("error", 20, 20)]
    assert decide(runs, **POLICY) == (True, "error; requeued (1 of 3 attempts in a row without progress)")
    runs += [Outcome("error", 20, 20), Outcome("error", 20, 20)]
    go, why = decide(runs, **POLICY)
    assert not go and why.startswith("requeue cap: 3 consecutive attempts without checkpoint progress")


def test_policy_switches():
    assert decide([Outcome("error", 0, 5)], requeue=True, on_error=False, max_stalled=3) == \
        (False, "error; retry.on_error is off in the spec")
    assert decide([Outcome("oom", 0, 5)], requeue=True, on_error=False, max_stalled=3)[0] is False
    assert decide([Outcome("node_failure", 0, 5)], requeue=True, on_error=False, max_stalled=3)[0] is True
    assert decide([Outcome("preemption", 0, 5)], requeue=False, on_error=True, max_stalled=3) == \
        (False, "preemption; requeue is off in the spec")
    assert decide([Outcome("completed", 0, 5)], **POLICY) == (False, "completed")
    assert decide([Outcome("cancelled", 0, 5)], **POLICY) == (False, "cancelled")


def test_unrecorded_end_steps_come_from_the_next_start():
    runs = fill_end_steps([Outcome("requeued", 0), Outcome("preemption", 30), Outcome(None, 30)], current_step=50)
    assert [(o.step_start, o.step_end) for o in runs] == [(0, 30), (30, 30), (30, 50)]


def test_latest_committed_step_needs_a_manifest(tmp_path):
    assert latest_committed_step(None) is None
    assert latest_committed_step(tmp_path / "none") == 0
    for step, manifest in ((10, True), (20, True), (30, False)):
        (tmp_path / f"step_{step:08d}").mkdir()
        if manifest:
            (tmp_path / f"step_{step:08d}" / "manifest.json").write_text("{}")
    (tmp_path / "step_00000040.tmp-ab").mkdir()
    assert latest_committed_step(tmp_path) == 20


@pytest.fixture
def job(tmp_path, monkeypatch):
    """The environment of an hpctrain batch script (array task 2, no Slurm), its spec and checkpoint dir."""
    ckpt = tmp_path / "ckpt"
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"requeue": True, "checkpoint": {"dir": str(ckpt)},
                                "retry": {"on_error": True, "max_stalled_attempts": 2}}))
    env = {"HPCTRAIN_JOB_ID": "1", "HPCTRAIN_JOURNAL_DIR": str(tmp_path / "journal"), "HPCTRAIN_SPEC": str(spec),
           "SLURM_ARRAY_TASK_ID": "2"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    return ckpt / "task-2"  # each array task checkpoints in its own subdirectory


def attempt(*args: str, attempt_no: str = "0") -> subprocess.CompletedProcess:
    """`hpctrain attempt ...` in run ``attempt_no`` (Slurm's requeue count)."""
    import os

    env = {**os.environ, "SLURM_RESTART_COUNT": attempt_no}
    return subprocess.run([sys.executable, "-m", "hpctrain", "attempt", *args], capture_output=True, text=True, env=env)


def commit(ckpt, step):
    (ckpt / f"step_{step:08d}").mkdir(parents=True)
    (ckpt / f"step_{step:08d}" / "manifest.json").write_text("{}")


def test_batch_script_bookkeeping_counts_runs_and_refuses_past_the_cap(job, tmp_path):
    journal = Journal(tmp_path / "journal")
    # Run 0 checkpoints step 10 then crashes: progress, so requeue (not under Slurm: only journaled).
    assert attempt("start").stdout.strip() == "0"
    commit(job, 10)
    end = attempt("end", "--exit-code", "1", attempt_no="0")
    assert end.returncode == 0 and "error; requeued (0 of 2" in end.stderr
    # Runs 1 and 2 crash at once: the second is the cap.
    for n in ("1", "2"):
        assert attempt("start", attempt_no=n).stdout.strip() == n
        attempt("end", "--exit-code", "1", attempt_no=n)
    ends = [r for _, r in journal.records(kinds=["attempt_end"])]
    assert [e["requeued"] for e in ends] == [True, True, False]
    assert ends[-1]["message"].startswith("requeue cap: 2 consecutive attempts")
    assert [(n, o.cause, o.step_start, o.step_end) for n, o in journal_outcomes(journal, 2).items()] == \
        [(0, "error", 0, 10), (1, "error", 10, 10), (2, "error", 10, 10)]
    # Another task of the same job has its own history.
    assert journal_outcomes(journal, 0) == {}


@pytest.mark.parametrize("spec", [
    {},
    {"requeue": False, "retry": {"on_error": True, "in_place": 3, "max_stalled_attempts": 5, "exclude_node_after": 1},
     "checkpoint": {"dir": "/scratch/ck", "memory_every_steps": 3},
     "resources": {"nodes": 2, "gpus_per_node": 4, "spare_nodes": 1, "tasks_per_node": 4}},
    {"resources": {"nodes": [4, 2], "gpus_per_node": 2}, "checkpoint": {"every_steps": 10}},
])
def test_the_policy_submit_resolves_reads_back_as_the_spec_gives_it(spec):
    policy = RunPolicy.of(spec)
    assert RunPolicy.from_json(json.loads(json.dumps(policy.to_json()))) == policy


def test_a_jobs_resolved_policy_is_what_attempt_follows_and_it_imports_no_spec_models(job, tmp_path):
    """Submit writes policy.json beside spec.json: `attempt` reads it (twice a run, once between SIGTERM and SIGKILL)
    without pydantic. A job dir without one (submitted by an earlier hpctrain) is read from its spec.json, alike."""
    journal = Journal(tmp_path / "journal")
    spec = json.loads((tmp_path / "spec.json").read_text())
    (tmp_path / "policy.json").write_text(json.dumps({**RunPolicy.of(spec).to_json(), "max_stalled": 1}))
    started = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpctrain", "attempt", "start"],
                             capture_output=True, text=True)
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in started.stderr.splitlines() if ln.startswith("import time:")}
    assert started.stdout.strip() == "0" and "hpctrain.runtime.attempts" in imported and "pydantic" not in imported
    end = attempt("end", "--exit-code", "1")
    assert "(error, exit 1): requeue cap: 1 consecutive" in end.stderr  # the policy file's cap, not the spec's 2
    (tmp_path / "policy.json").unlink()
    assert attempt("start", attempt_no="1").stdout.strip() == "1"
    commit(job, 10)
    assert "error; requeued (0 of 2" in attempt("end", "--exit-code", "1", attempt_no="1").stderr
    assert [r["requeued"] for _, r in journal.records(kinds=["attempt_end"])] == [False, True]


def test_a_run_slurm_requeued_by_itself_is_refused_past_the_cap(job, tmp_path):
    # Two runs that never got to record their end (e.g. preempted without grace before any step).
    assert attempt("start", attempt_no="0").stdout.strip() == "0"
    assert attempt("start", attempt_no="1").stdout.strip() == "1"
    refused = attempt("start", attempt_no="2")
    assert refused.returncode == 3 and "not running: requeue cap: 2 consecutive" in refused.stderr
    # After a recorded stop, a start is a person's requeue: it runs.
    assert attempt("start", attempt_no="3").stdout.strip() == "3"


def test_a_run_slurm_starts_after_one_completed_the_job_ends_at_once(job, tmp_path):
    """Slurm 24.11 requeues a job preempted past its grace time once more when its next run completes: that run
    journals itself as Slurm's rerun and exits 4 (the batch script then exits 0) without running the command."""
    journal = Journal(tmp_path / "journal")
    assert attempt("start", attempt_no="0").stdout.strip() == "0"  # killed at the end of its grace time: no end
    assert attempt("start", attempt_no="1").stdout.strip() == "1"
    assert attempt("end", "--exit-code", "0", attempt_no="1").returncode == 0
    rerun = attempt("start", attempt_no="2")
    assert rerun.returncode == 4 and rerun.stdout == ""
    assert rerun.stderr == ("hpctrain: not running again: run 1 completed the job after a preemption and Slurm started "
                            "this run on its own (Slurm 24.11 requeues a preempted job once more when it ends)\n")
    assert [(n, o.cause) for n, o in journal_outcomes(journal, 2).items()] == [(0, None), (1, "completed"), (2, "rerun")]


def test_only_a_completion_after_a_preemption_is_followed_by_slurms_own_rerun():
    def outcomes(*causes):
        return dict(enumerate(Outcome(c) for c in causes))

    assert rerun_of_completed(outcomes("preemption", "completed")) is not None
    assert rerun_of_completed(outcomes(None, "completed")) is not None  # killed without a word, then completed
    assert rerun_of_completed(outcomes("completed")) is None  # a person's requeue of a job that ran once
    assert rerun_of_completed(outcomes("error", "completed")) is None
    assert rerun_of_completed(outcomes("preemption", "error")) is None


def test_a_failed_step_restarts_in_place_up_to_the_specs_count(job, tmp_path, monkeypatch):
    journal = Journal(tmp_path / "journal")
    spec = json.loads((tmp_path / "spec.json").read_text())
    (tmp_path / "spec.json").write_text(json.dumps({**spec, "retry": {**spec["retry"], "in_place": 2}}))
    attempt("start")
    commit(job, 20)
    for done, expected in (("0", 0), ("1", 0), ("2", 1)):  # the third failure ends the run
        monkeypatch.setenv("HPCTRAIN_STEP_RESTART", done)
        assert attempt("restart", "--exit-code", "137").returncode == expected
    assert attempt("restart", "--exit-code", "0").returncode == 1  # a step that succeeded is not restarted
    restarts = [r for _, r in journal.records(kinds=["step_restart"])]
    assert [(r["step_restart"], r["exit_code"], r["step"], r["attempt"]) for r in restarts] == [
        (1, 137, 20, 0), (2, 137, 20, 0)]
    # Once the trainer has checkpointed and requeued this run, its exit is no failure to restart.
    monkeypatch.setenv("HPCTRAIN_STEP_RESTART", "0")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    journal.write("requeue", cause="preemption", step=30, checkpointed=True, message="preempted at step 30")
    assert attempt("restart", "--exit-code", "1").returncode == 1


def test_no_in_place_restart_unless_the_spec_asks(job):
    attempt("start")
    assert attempt("restart", "--exit-code", "1").returncode == 1


def test_trainer_requeue_makes_the_batch_script_end_quiet(job, tmp_path, monkeypatch):
    journal = Journal(tmp_path / "journal")
    attempt("start")
    monkeypatch.setenv("SLURM_JOB_ID", "77")  # the trainer's records carry the run number under Slurm
    journal.write("requeue", cause="timeout", step=30, checkpointed=True, message="timeout at step 30")
    journal.write("requeued", step=30, message="scontrol requeue 77")
    assert attempt("end", "--exit-code", "0", attempt_no="0").stderr == ""
    assert [r["kind"] for _, r in journal.records()] == ["attempt_start", "requeue", "requeued"]


def test_a_notice_that_came_after_the_trainers_last_step_requeues_nothing(job, tmp_path, monkeypatch):
    journal = Journal(tmp_path / "journal")
    attempt("start")
    commit(job, 150)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    journal.write("finished", step=150)
    monkeypatch.delenv("SLURM_JOB_ID")
    end = attempt("end", "--exit-code", "0", "--signal", "USR2", attempt_no="0")
    assert end.returncode == 0 and end.stderr == ""
    assert [(r["cause"], r["requeued"]) for _, r in journal.records(kinds=["attempt_end"])] == [("completed", False)]


def test_attempt_records_and_sacct_meet_in_the_ledger(job, tmp_path, monkeypatch):
    journal = Journal(tmp_path / "journal")
    attempt("start")
    commit(job, 10)
    attempt("end", "--exit-code", "1", attempt_no="0")
    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert({"name": "a", "site": "dev", "slurm_job_id": "5", "is_array": 1,
                                      "state": "RUNNING", "spec_json": "{}"})
        ledger.db.table("array_tasks").insert({"job_id": 1, "task_index": 2, "param_index": 2})
        ingest_journal(ledger, journal)
        (row,) = ledger.attempts.of_job(1)
        assert (row["attempt"], row["task_index"], row["cause"], row["step_start"], row["step_end"], row["requeued"]) \
            == (0, 2, "error", 0, 10, 1)

        # sacct still lists the failed run as the task's last: requeued by us, so not finished.
        class Recorded:
            def sacct(self, ids, fields):
                return parse_parsable_with_header(
                    "JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Reason\n"
                    "5_2|FAILED|1:0|2026-11-22T03:33:36|2026-11-22T03:33:36|2026-11-22T03:33:38|n1||None\n")

        Poller(ledger, Recorded(), "dev").refresh()
        assert ledger.jobs.task_states(1) == {2: "REQUEUED"}
        (row,) = ledger.attempts.of_job(1)
        assert (row["state"], row["cause"]) == ("FAILED", "error")


def test_cause_is_filled_from_the_slurm_state_until_journaled(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert({"name": "a", "site": "dev", "slurm_job_id": "7", "state": "RUNNING",
                                      "spec_json": "{}"})

        class Recorded:
            def sacct(self, ids, fields):
                return parse_parsable_with_header(
                    "JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Reason\n"
                    "7|PREEMPTED|0:15|2026-11-22T03:50:20|2026-11-22T03:50:20|2026-11-22T03:50:42|n1||None\n"
                    "7|RUNNING|0:0|2026-11-22T03:51:20|2026-11-22T03:51:30|Unknown|n1||None\n")

        Poller(ledger, Recorded(), "dev").refresh()
        assert [(a["attempt"], a["cause"]) for a in ledger.attempts.of_job(1)] == \
            [(0, "preemption"), (1, None)]
        assert histories(Recorded().sacct([], ()))["7"][-1].state == "RUNNING"


def test_an_arrays_own_id_without_a_task_index_is_no_task(tmp_path):
    """Seen on a loaded dev cluster: while an array's last task ran, sacct listed it as the array's own id,
    PENDING; it must not become an attempt of a task -1 the array does not have."""
    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert({"name": "a", "site": "dev", "slurm_job_id": "9", "is_array": 1,
                                      "state": "PENDING", "spec_json": "{}"})
        ledger.db.table("array_tasks").insert_all({"job_id": 1, "task_index": t, "param_index": t} for t in (0, 1))

        class Recorded:
            def sacct(self, ids, fields):
                return parse_parsable_with_header(
                    "JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Reason\n"
                    "9_0|RUNNING|0:0|2026-11-24T13:37:19|2026-11-24T13:37:19|Unknown|n1||None\n"
                    "9|PENDING|0:0|2026-11-24T13:37:19|2026-11-24T13:37:19|Unknown|n2||None\n")

        Poller(ledger, Recorded(), "dev").refresh()
        assert [(a["task_index"], a["state"]) for a in ledger.attempts.of_job(1)] == [(0, "RUNNING")]
        assert ledger.jobs.get(1)["state"] == "RUNNING"


SACCT_HEADER = "JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Reason\n"


class Recorded:
    """A Slurm whose sacct answers with the lines given."""

    def __init__(self, lines: str):
        self.lines = lines

    def sacct(self, ids, fields):
        return parse_parsable_with_header(SACCT_HEADER + self.lines)


def undecided(ledger) -> list[tuple]:
    return ledger.db.execute("SELECT job_id, task_index, attempt FROM attempts WHERE requeued IS NULL").fetchall()


def test_runs_that_nothing_decides_on_are_decided(tmp_path):
    """A job cancelled before it started has a run in sacct and no batch script to decide on it; a run Slurm
    requeued by itself is followed by the next: a poll decides both, as reconcile's supervision does; the running
    run stays open."""
    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert_all([
            {"name": "never", "site": "dev", "slurm_job_id": "11", "state": "PENDING", "spec_json": "{}"},
            {"name": "again", "site": "dev", "slurm_job_id": "12", "state": "RUNNING", "spec_json": "{}"}])
        slurm = Recorded(
            "11|CANCELLED|0:0|2026-11-27T06:00:00|None|2026-11-27T06:05:00|None assigned||None\n"
            "12|PREEMPTED|0:15|2026-11-27T06:00:00|2026-11-27T06:00:01|2026-11-27T06:10:00|n1||None\n"
            "12|RUNNING|0:0|2026-11-27T06:10:00|2026-11-27T06:11:00|Unknown|n2||None\n")
        Poller(ledger, slurm, "dev").refresh()  # `status`'s poll decides them as reconcile would
        assert ledger.jobs.get(1)["state"] == "CANCELLED" and undecided(ledger) == [(2, -1, 1)]
        assert supervise(ledger, slurm, "dev") == []
        assert undecided(ledger) == [(2, -1, 1)]
        assert [(a["requeued"], a["decision"]) for a in ledger.attempts.of_job(1) + ledger.attempts.of_job(2)[:1]] == [
            (0, "no more runs: CANCELLED"), (1, "requeued by Slurm")]


def test_a_second_poll_with_nothing_new_writes_no_row(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert({"name": "a", "site": "dev", "slurm_job_id": "9", "is_array": 1,
                                      "state": "PENDING", "spec_json": "{}"})
        ledger.db.table("array_tasks").insert_all({"job_id": 1, "task_index": t, "param_index": t} for t in range(3))
        lines = ("9_0|COMPLETED|0:0|2026-11-27T06:00:00|2026-11-27T06:00:01|2026-11-27T06:09:00|n1||None\n"
                 "9_1|RUNNING|0:0|2026-11-27T06:00:00|2026-11-27T06:00:01|Unknown|n2||None\n"
                 "9_[2]|PENDING|0:0|2026-11-27T06:00:00|Unknown|Unknown|None assigned||Priority\n")
        poller = Poller(ledger, Recorded(lines), "dev")
        assert poller.refresh() == 1
        conn = ledger.db.conn
        before = conn.total_changes
        assert poller.refresh() == 0 and conn.total_changes == before
        poller.client = Recorded(lines.replace("9_1|RUNNING|0:0", "9_1|FAILED|1:0").replace(
            "Unknown|n2", "2026-11-27T06:10:00|n2"))
        poller.refresh()
        assert ledger.jobs.task_states(1) == {0: "COMPLETED", 1: "FAILED", 2: "PENDING"}
        assert [(a["task_index"], a["state"], a["cause"]) for a in ledger.attempts.of_job(1)] == [
            (0, "COMPLETED", "completed"), (1, "FAILED", "error"), (2, "PENDING", None)]
        # sacct says the same again, but hpctrain requeued the failed task meanwhile: that poll folds it in.
        ledger.attempts.record(1, 1, 0, requeued=1, decision="requeued by reconcile")
        poller.refresh()
        assert ledger.jobs.task_states(1)[1] == "REQUEUED"


@pytest.mark.parametrize("exit_code, signal_name, state, restarts, want", [
    (143, None, "CANCELLED", 0, ("cancelled", False)),  # scancel's SIGTERM reached the step before the batch shell
    (129, None, "COMPLETING", 0, ("cancelled", False)),
    (143, None, "RUNNING", 0, ("error", False)),  # killed by someone else while the job runs on: its own failure
    (1, None, "CANCELLED", 0, ("error", False)),
    (0, None, "CANCELLED", 0, ("completed", False)),
    (143, "TERM", "CANCELLED", 0, ("cancelled", False)),
    # `scontrol requeue`'s SIGTERM reached the step first: Slurm raised Restarts with the requeue (the job shows
    # COMPLETING until its processes end); nothing is forgotten (an "error" here once removed the secrets file the
    # next run needed).
    (143, None, "COMPLETING", 1, ("preemption", True)),
    (143, "TERM", "COMPLETING", 1, ("preemption", True)),
])
def test_a_step_killed_by_the_cancel_before_the_shell_saw_it_ended_by_the_cancel(monkeypatch, exit_code, signal_name,
                                                                                 state, restarts, want):
    import time

    import hpctrain.runtime
    from hpctrain.cli.attempt import _cause
    from hpctrain.runtime.guard import JobNow

    asked = []
    monkeypatch.setattr(hpctrain.runtime, "job_now", lambda client: asked.append(1) or JobNow(state, restarts, time.time() + 3600))
    assert _cause(exit_code, signal_name, 0) == want
    assert bool(asked) == (exit_code in (143, 129) or signal_name is not None)  # Slurm asked only when it may matter


def test_supervision_reads_the_live_runs_only_after_a_death_until_it_has_decided_each(tmp_path):
    """Issue 59: supervision looked for undecided deaths among every live run on each tick and reconcile (0.03 s on
    2,000 active jobs). Now a death marks its site; the mark stays while a death is left (a requeue that failed)."""
    def supervised() -> tuple[list, list[str]]:
        decisions: list = []
        statements, _ = traced(ledger, lambda: decisions.extend(supervise(ledger, None, "dev")))
        return decisions, statements

    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert({"name": "dies", "site": "dev", "state": "RUNNING",
                                      "spec_json": json.dumps({"retry": {"on_error": True}})})
        ledger.attempts.record(1, -1, 0, state="RUNNING", started_at=1.0)
        assert supervised()[0] == []
        decisions, statements = supervised()
        assert decisions == [] and [s for s in statements if "attempts" in s or "FROM jobs" in s] == []
        ledger.attempts.record(1, -1, 0, state="FAILED", cause="error", ended_at=2.0)
        ledger.jobs.set_state(1, "FAILED")
        [failed] = supervised()[0]  # requeued on error, but the job has no batch script to run again
        assert not failed.requeued and failed.why.startswith("requeue failed, will retry")
        [again] = supervised()[0]
        assert again.why == failed.why
        Table(ledger, "jobs").update(1, {"spec_json": "{}"})  # errors are no longer requeued
        [stopped] = supervised()[0]
        assert not stopped.requeued and not stopped.why.startswith("requeue failed")
        decisions, statements = supervised()
        assert decisions == [] and [s for s in statements if "attempts" in s] == []


def _claimer(path, slurm_id, barrier, won):
    from hpctrain.runtime.race import claim

    barrier.wait()
    won[slurm_id] = claim(path, slurm_id)


def test_a_claim_names_the_runners_ledger_id_or_as_an_earlier_hpctrain_wrote_it_its_slurm_id():
    """Ledger ids are unique across the clusters of a race, Slurm ids are not: slurm job 7 of one cluster is not
    that of another. A race an earlier hpctrain claimed with a Slurm id is still decided by it."""
    from hpctrain.runtime.race import won

    assert won("job 3", 3, "7") and not won("job 3", 7, "3") and not won("job 3", 4, None)
    assert won("7", 3, "7") and not won("7", 7, "3") and not won("7", 7, None)


def test_of_runners_claiming_a_race_at_once_exactly_one_wins_and_keeps_it(tmp_path):
    """`submit --race`: the first batch script to claim the race runs the command; a winner Slurm requeued runs
    again; every other loses, whenever it comes."""
    import multiprocessing

    from hpctrain.runtime.race import claim

    for trial in range(20):
        path = tmp_path / f"race-{trial}"
        ids = [1000 + k for k in range(6)]  # ledger ids
        with multiprocessing.Manager() as manager:
            won, barrier = manager.dict(), manager.Barrier(len(ids))
            runners = [multiprocessing.Process(target=_claimer, args=(path, i, barrier, won)) for i in ids]
            for p in runners:
                p.start()
            for p in runners:
                p.join()
            results = dict(won)
        [winner] = [i for i, w in results.items() if w]
        assert len(results) == len(ids) and path.read_text() == f"job {winner}\n"
        assert claim(path, winner) and not claim(path, 999)
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no claim left behind


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """An `scontrol` first on PATH that logs its arguments and answers as 22.05 does for job 77 (run 0, or
    ``restarts`` when Slurm has requeued it; in ``state``); with ``kill_itself`` it first sends itself that signal, as Slurm
    signalling every process of a job step does. Returns a setter and the log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.delenv("SLURM_CONF", raising=False)

    def answer(restarts: int = 0, kill_itself: str = "", state: str = "RUNNING") -> None:
        (bin_dir / "scontrol").write_text(f"""#!/bin/bash
echo "$*" >> {log}
{f"kill -s {kill_itself} $$" if kill_itself else ""}
case "$1 $2 $3" in
  "show config "*) echo "SLURM_VERSION           = 22.05.8" ;;
  "-o show job") echo "JobId=77 JobState={state} Restarts={restarts} StartTime=2026-12-06T07:00:00 TimeLimit=UNLIMITED" ;;
esac
""")
        (bin_dir / "scontrol").chmod(0o755)

    return answer, log


def requeues_asked(log) -> list[str]:
    return [line for line in log.read_text().splitlines() if line.startswith("requeue ")] if log.exists() else []


@pytest.mark.parametrize("kill_itself", ["USR2", "TERM"])
def test_a_later_copy_of_the_notice_does_not_kill_the_trainers_requeue(job, tmp_path, monkeypatch, scontrol,
                                                                       kill_itself):
    """Slurm signals every process of the step: a notice passed on again must not end the requeue's scontrol."""
    from hpctrain.runtime.guard import PreemptionGuard
    from hpctrain.runtime.requeue import requeue_after_stop

    answer, log = scontrol
    answer(kill_itself=kill_itself)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    guard = PreemptionGuard(watch=False)
    try:
        guard.signal = signal.SIGUSR2
        requeue_after_stop(guard, "preemption at step 30", step=30, checkpointed=True)
        assert all(signal.getsignal(s) == guard._handle for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP))
    finally:
        guard.uninstall()
    assert [r["kind"] for _, r in Journal(tmp_path / "journal").records()] == ["requeue", "requeued"]
    assert len(requeues_asked(log)) == 1


def test_a_slurm_command_killed_by_a_signal_says_so(scontrol):
    answer, _ = scontrol
    answer(kill_itself="USR2")
    with pytest.raises(SlurmError, match="^scontrol show config: killed by SIGUSR2$"):
        SlurmClient().version()


@pytest.mark.parametrize("killed", [False, True], ids=["failed", "killed-half-way"])
@pytest.mark.parametrize("state, restarts, cause, requeued", [
    ("RUNNING", 0, "preemption", "(the trainer's own requeue failed: asked again by the batch script)"),
    ("RUNNING", 1, "preemption", "requeued by Slurm"),  # meanwhile
    ("COMPLETING", 0, "cancelled", None),  # the requeue failed for the cancel: not run again
])
def test_a_run_whose_trainer_could_not_requeue_is_requeued_by_the_batch_script(job, tmp_path, monkeypatch, scontrol,
                                                                               state, restarts, cause, requeued,
                                                                               killed):
    """The trainer checkpointed on the notice but its requeue failed, or it was killed before its requeue said how
    it went (no `requeued`): `attempt end` decides and requeues, unless Slurm has requeued the job meanwhile or it is
    being cancelled."""
    answer, log = scontrol
    journal = Journal(tmp_path / "journal")
    attempt("start")
    commit(job, 30)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    journal.write("requeue", cause="preemption", step=30, checkpointed=True, message="preemption at step 30")
    if not killed:
        journal.write("requeue_failed", step=30, message="scontrol show config: killed by SIGUSR2")
    answer(restarts=restarts, state=state)
    end = attempt("end", "--exit-code", "0", attempt_no="0")
    assert end.returncode == 0, end.stderr
    [ends] = [r for _, r in journal.records(kinds=["attempt_end"])]
    assert (ends["cause"], ends["step_end"], ends["requeued"]) == (cause, 30, requeued is not None)
    assert ends["message"].endswith(requeued or "cancelled")
    assert len(requeues_asked(log)) == (requeued is not None and "batch script" in requeued)
    asked = requeues_asked(log) != []
    assert ends.get("requeue_follows", False) == asked
    assert [r["kind"] for _, r in journal.records(kinds=["requeued"])] == (["requeued"] if asked else [])


@pytest.mark.parametrize("trainer_said, undecided", [
    (["requeue", "requeued"], False),
    (["requeue"], True),  # killed between its record and its requeue (or before saying how that went)
])
def test_a_requeue_is_decided_in_the_ledger_only_once_its_writer_says_it_was_made(tmp_path, trainer_said, undecided):
    """The trainer journals the stop before requeueing (`requeue`) and how that went after (`requeued`): a run
    with the first alone stays undecided, and once Slurm has ended the job (PREEMPTED, nobody requeued it) reconcile's
    supervision decides it (here it can only try: the job has no batch script to submit again). A run decided
    before its records are read (sacct listed the next run: requeued by Slurm) stays decided, its cause from them."""
    journal = Journal(tmp_path / "journal")
    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert_all([{"name": n, "site": "dev", "slurm_job_id": str(7 + i), "state": "RUNNING",
                                           "spec_json": "{}"} for i, n in enumerate(("a", "decided"))])
        ledger.attempts.record(2, -1, 0, state="REQUEUED", requeued=1, decision="requeued by Slurm")
        ledger.attempts.record(2, -1, 1, state="RUNNING")
        for job_id, kind in [(1, k) for k in trainer_said] + [(2, "requeue")]:
            journal.write(kind, job_id=job_id, task_index=-1, attempt=0, cause="preemption", step=30,
                          checkpointed=True, message=f"{kind} at step 30")
        ingest_journal(ledger, journal)
        assert [e["kind"] for e in ledger.events.of_job(2)] == ["requeue"]  # no journal_error
        [decided, _] = ledger.attempts.of_job(2)
        assert (decided["cause"], decided["requeued"]) == ("preemption", 1)
        ledger.jobs.set_state(2, "COMPLETED")
        [run] = ledger.attempts.of_job(1)
        assert (run["cause"], run["step_end"], run["requeued"]) == ("preemption", 30, None if undecided else 1)
        ledger.jobs.set_state(1, "PREEMPTED")
        decisions = supervise(ledger, None, "dev")
    assert [(d.job_id, d.why.startswith("requeue failed, will retry")) for d in decisions] == \
        ([(1, True)] if undecided else [])
