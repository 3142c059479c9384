"""The in-job guard and requeue target, in one process (the cluster tests cover real preemption)."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from hpctrain.contract import JobEnvironment
from hpctrain.ledger.journal import Journal
from hpctrain.runtime import JobNow, PreemptionGuard
from hpctrain.runtime.guard import stop_cause
from hpctrain.runtime.requeue import job_now, self_requeue
from hpctrain.slurm import SlurmClient


def test_signals_set_the_stop_flag_and_cause_follows_the_job_state(monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    for sig, left, cause in ((signal.SIGUSR2, 3600, "preemption"), (signal.SIGTERM, 60, "timeout"),
                             (signal.SIGHUP, 3600, "preemption")):
        asked = []

        def probe(left=left):
            asked.append(signal.getsignal(signal.SIGTERM))
            return JobNow("RUNNING", 2, time.time() + left)

        guard = PreemptionGuard(job_now=probe, timeout_margin_s=120)
        try:
            assert not guard.should_stop()
            os.kill(os.getpid(), sig)
            assert guard.should_stop() and guard.signal == sig
            assert guard.cause() == cause and guard.cause() == cause
            # Decided once, Slurm asked with the stop signals ignored: its command, started meanwhile, ignores them too.
            assert asked == [signal.SIG_IGN] and signal.getsignal(signal.SIGTERM) == guard._handle
        finally:
            guard.uninstall()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL


def test_the_cause_is_asked_again_while_slurm_does_not_answer(monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    answers = [None, JobNow("COMPLETING", 0, time.time() + 3600)]  # no answer (preemption), then a cancel
    guard = PreemptionGuard(job_now=lambda: answers.pop(0), timeout_margin_s=120)
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.should_stop()
        assert [guard.cause(), guard.cause(), guard.cause()] == ["preemption", "cancelled", "cancelled"]
    finally:
        guard.uninstall()


def test_a_stop_the_batch_shell_wrote_down_is_taken_by_rank_0_at_start_or_at_a_step(tmp_path, monkeypatch):
    notice = tmp_path / "notice-77.0"
    monkeypatch.setenv("HPCTRAIN_NOTICE_FILE", str(notice))
    monkeypatch.setenv("RANK", "0")
    notice.write_text("TERM\n")  # before the guard existed (srun had not started the task yet)
    guard = PreemptionGuard()
    try:
        assert guard.should_stop() and guard.signal == signal.SIGTERM
    finally:
        guard.uninstall()
    notice.unlink()
    for rank, stops in (("0", True), ("1", False)):  # one rank looks; the all-reduce tells the others
        monkeypatch.setenv("RANK", rank)
        guard = PreemptionGuard()
        try:
            assert not guard.should_stop()
            notice.write_text("USR2\n")
            assert guard.should_stop() is stops and guard.signal == (signal.SIGUSR2 if stops else None)
        finally:
            guard.uninstall()
            notice.unlink()


def test_cancel_is_told_from_preemption_by_the_job_state():
    far = time.time() + 3600
    # scancel: SIGTERM while the job is completing and Slurm has not requeued it.
    assert stop_cause(JobNow("COMPLETING", 0, far), 0, 120) == "cancelled"
    # Preemption without grace: Slurm has requeued the job already (Restarts went up).
    assert stop_cause(JobNow("COMPLETING", 1, far), 0, 120) == "preemption"
    # Preemption with a grace time: the notice comes while the job still runs.
    assert stop_cause(JobNow("RUNNING", 0, far), 0, 120) == "preemption"
    # At its time limit a completing job timed out; unknown state: preemption (requeue is the safe side).
    assert stop_cause(JobNow("COMPLETING", 0, time.time() + 5), 0, 120) == "timeout"
    assert stop_cause(None, 0, 120) == "preemption"
    # The notice before the limit (USR2 while running); a cancel of a job whose whole limit is within the margin.
    assert stop_cause(JobNow("RUNNING", 0, time.time() + 60), 0, 120) == "timeout"
    assert stop_cause(JobNow("COMPLETING", 0, time.time() + 100), 0, 120) == "cancelled"
    assert stop_cause(JobNow("CANCELLED", 0, time.time() + 100), 0, 120) == "cancelled"


def test_usr1_is_left_alone():
    guard = PreemptionGuard()
    try:
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        guard.uninstall()


def test_requeue_targets_the_array_task_not_the_array():
    assert JobEnvironment({"SLURM_JOB_ID": "812", "SLURM_ARRAY_JOB_ID": "800", "SLURM_ARRAY_TASK_ID": "12"}).requeue_target == "800_12"
    assert JobEnvironment({"SLURM_JOB_ID": "812"}).requeue_target == "812"


def test_finish_journals_the_work_done_unless_the_loop_stopped_on_a_notice(tmp_path, monkeypatch):
    """A loop that ran to its end says so from rank 0 (a notice after it then runs nothing again: the batch script
    counts the run completed); one stopped on a notice, and the other ranks, say nothing."""
    monkeypatch.setenv("HPCTRAIN_JOURNAL_DIR", str(tmp_path))
    finished = lambda: [r["message"] for _, r in Journal(tmp_path).records(kinds=["finished"])]  # noqa: E731
    for rank, notice in (("1", False), ("0", True), ("0", False)):
        monkeypatch.setenv("RANK", rank)
        guard = PreemptionGuard()
        try:
            assert not guard.should_stop()
            if notice:
                os.kill(os.getpid(), signal.SIGUSR2)
                assert guard.should_stop()
            guard.finish()
        finally:
            guard.uninstall()
    assert finished() == ["the training loop ran to its end"]


def test_a_loop_reads_its_hyperparameters_with_its_trials_parameters_applied(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "own", "hyperparameters": {"lr": 0.1, "steps": 60}}))
    env = {"HPCTRAIN_SPEC": str(spec), "HPCTRAIN_PARAMS": json.dumps({"lr": 0.01, "parallel.micro_batch": 4})}
    assert JobEnvironment(env).hyperparameters == {"lr": 0.01, "steps": 60}  # a dotted key sets another field
    assert JobEnvironment({"HPCTRAIN_SPEC": str(spec)}).hyperparameters == {"lr": 0.1, "steps": 60}
    assert JobEnvironment({}).hyperparameters == {}


def slurm_stubs(tmp_path, monkeypatch, qos_mode: str | None, cluster_mode: str = "REQUEUE", state: str = "RUNNING",
                preempt_time: str = "2026-12-06T07:05:00", end_time: str | None = None) -> tuple[SlurmClient, Path]:
    """A client of Slurm 24.11 whose `scontrol` and `sacctmgr` are stubs: job 77 in QOS lowc of preempt mode
    ``qos_mode`` (None: sacctmgr does not answer), the cluster's ``cluster_mode``, its EndTime ``end_time`` (by default
    its PreemptTime's, as when the preemption killed it); and the file of the calls made."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    stubs = {
        "scontrol": f"""echo "$*" >> {log}
case "$1 $2 $3" in
  "show config "*) printf 'SLURM_VERSION = 24.11.5\\nPreemptMode = {cluster_mode}\\n' ;;
  "-o show job") echo "JobId=77 JobState={state} Restarts=0 StartTime=2026-12-06T07:00:00 TimeLimit=UNLIMITED \\
PreemptTime={preempt_time} EndTime={end_time or preempt_time} QOS=lowc" ;;
esac""",
        "sacctmgr": f'echo "sacctmgr $*" >> {log}\n'
        + ('echo "sacctmgr: error: slurmdbd: no answer" >&2; exit 1' if qos_mode is None else f'echo "lowc|{qos_mode}"'),
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.delenv("HPCTRAIN_JOURNAL_DIR", raising=False)
    return SlurmClient(bin_dir=bin_dir), log


@pytest.mark.parametrize("qos_mode, cluster_mode, left_to_slurm", [
    ("requeue", "OFF", True),
    ("cancel", "REQUEUE", False),  # measured on 24.11: such a job ends PREEMPTED, never requeued
    ("cluster", "REQUEUE", True),  # the QOS defers to the cluster's mode
    ("cluster", "CANCEL", False),
    (None, "REQUEUE", False),  # sacctmgr does not answer: hpctrain requeues (a third run at worst, no lost job)
])
def test_from_24_11_a_preempted_job_is_left_to_slurm_only_where_slurm_requeues_it(tmp_path, monkeypatch, qos_mode,
                                                                                 cluster_mode, left_to_slurm):
    """Slurm's commands as stubs (the cluster tests preempt in the dev cluster's requeue-mode QOS)."""
    client, log = slurm_stubs(tmp_path, monkeypatch, qos_mode, cluster_mode)
    how = self_requeue(client, env={"SLURM_JOB_ID": "77"})
    assert how.startswith("left to Slurm 24.11") == left_to_slurm, how
    assert ("requeue 77" in log.read_text().splitlines()) == (not left_to_slurm)


@pytest.mark.parametrize("qos_mode, preempt_time, end_time, cause", [
    # PreemptMode=CANCEL without grace: SIGTERM with the job COMPLETING, Restarts unchanged, as after a scancel, but
    # PreemptTime set (measured on 22.05.8 and 24.11.5); its own `scontrol requeue` then runs it again.
    ("cancel", "2026-12-06T07:05:00", None, "preemption"),
    ("cancel", "2026-12-06T07:05:00", "2026-12-06T07:05:01", "preemption"),  # the kill a second past the notice
    (None, "2026-12-06T07:05:00", None, "preemption"),  # the mode unknown: a requeue is the side that loses nothing
    ("requeue", "2026-12-06T07:05:00", None, "cancelled"),  # Slurm requeues its preempted jobs: a scancel in the grace
    ("cancel", "None", None, "cancelled"),  # never preempted: a scancel
    # A scancel 7 s into a CANCEL-mode grace: PreemptTime stays the notice's, EndTime is the cancel's.
    ("cancel", "2026-12-06T07:05:00", "2026-12-06T07:05:07", "cancelled"),
])
def test_a_job_its_preemption_cancels_stops_for_a_preemption(tmp_path, monkeypatch, qos_mode, preempt_time, end_time,
                                                             cause):
    client, log = slurm_stubs(tmp_path, monkeypatch, qos_mode, state="COMPLETING", preempt_time=preempt_time,
                              end_time=end_time)
    assert stop_cause(job_now(client, env={"SLURM_JOB_ID": "77"}), 0, 120) == cause
    # The QOS's preempt mode is asked only of a job that its preemption is ending.
    assert ("sacctmgr" in log.read_text()) == (preempt_time != "None" and end_time in (None, "2026-12-06T07:05:01"))
