"""hpctrain's submitit executor on the dev cluster: results and exceptions as submitit returns them, the jobs in
the ledger, one sacct per poll however many jobs are waited on, and a checkpointable call preempted twice by QOS
high jobs that loses no step, the second time under PreemptMode=cancel."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import pytest
from submitit.core.utils import FailedJobError

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.submit import Submitter
from hpctrain.submit.executor import Executor, HpctrainJob

from helpers.cli import run_cli
from helpers.cluster import HIGH, qos_setting, slurm_setting
from helpers.executor import Loop, add
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm]


def test_results_and_exceptions_come_back_as_from_submitit(dev_cluster, isolated_ledger):
    ex = Executor(site="dev")
    ex.update_parameters(timeout_min=5, mem_gb=1, account="teama")
    one = ex.submit(add, 1, 2)
    many = ex.map_array(add, [1, 2, 3], [10, 20, 30])
    assert one.result() == 3
    assert [j.job_id for j in many] == [f"{many[0].job_id.split('_')[0]}_{t}" for t in range(3)]
    assert (many[0].result(), many[2].result()) == (11, 33)
    with pytest.raises(FailedJobError, match="ValueError: two is refused"):
        many[1].result()
    # hpctrain's log of the task; the task writes its result before its traceback reaches the log, so a loaded
    # machine shows the log's first line only for a moment (seen: "Traceback (most recent call last):")
    wait_until(lambda: "two is refused" in (many[1].stderr() or ""), 60, 0.5, "the task's traceback in its log")

    # The ledger has both submissions, as `status` shows them once their states come in.
    def states():
        listed = {r["id"]: r for r in json.loads(run_cli("status", "--all", "--json").stdout)}
        return [listed[j.ledger_id]["state"] for j in (one, many[0])] == ["COMPLETED", "FAILED"] and listed

    listed = wait_until(states, 60, 1.0, "the ledger to see both jobs end")
    assert listed[many[0].ledger_id]["task_states"] == "COMPLETED:2,FAILED:1"
    assert listed[one.ledger_id]["account"] == "teama"


def test_waiting_on_many_jobs_is_one_sacct_per_poll(dev_cluster, isolated_ledger, slurm_calls, monkeypatch):
    env, counts = slurm_calls
    monkeypatch.setenv("PATH", env["PATH"])
    ex = Executor(site="dev")
    ex.update_parameters(timeout_min=5, mem_gb=1, account="teama")
    HpctrainJob.watcher.update()  # settles jobs earlier tests left registered (their ledgers have none active)
    jobs = [ex.submit(add, k, 1) for k in (3, 4, 5, 6, 7)]
    before = counts()["sacct"]
    HpctrainJob.watcher.update()
    assert counts()["sacct"] - before == 1
    assert all(j.state in ("PENDING", "RUNNING", "COMPLETED", "COMPLETING") for j in jobs)
    assert [j.result() for j in jobs] == [4, 5, 6, 7, 8]


@pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason=(
    "host's Slurm only (CI time): a cancel is told from a preemption by the job's state, the same on every release "
    "(test_runtime's stop_cause)"))
def test_a_cancelled_call_stops_and_is_not_requeued(dev_cluster, isolated_ledger, tmp_path):
    """`cancel` of a guarded call: rank 0 tells the cancel from a preemption by the job's state (Slurm's SIGTERM
    looks the same), so the call stops at its step without requeueing and the job ends CANCELLED, run once."""
    progress = tmp_path / "progress"
    ex = Executor(site="dev")
    ex.update_parameters(timeout_min=15, mem_gb=1, account="teama", name="cancelled-loop")
    job = ex.submit(Loop(100_000, progress))
    wait_until(lambda: progress.exists() and len(progress.read_text().split()) >= 5, 120, 0.2, "the call to run")
    assert run_cli("cancel", str(job.ledger_id)).returncode == 0

    def ended() -> dict | None:
        listed = {r["id"]: r for r in json.loads(run_cli("status", "--all", "--json").stdout)}
        return listed[job.ledger_id] if listed[job.ledger_id]["state"] == "CANCELLED" else None

    assert wait_until(ended, 120, 1.0, "the call's job to end cancelled")["restarts"] == 0
    with Ledger(isolated_ledger) as ledger:
        journal = Journal(Path(ledger.jobs.get(job.ledger_id)["job_dir"]) / "journal")
        runs = [(a["attempt"], a["cause"]) for a in ledger.attempts.of_job(job.ledger_id)]
    assert [r["kind"] for _, r in journal.records(kinds=["requeue", "requeue_failed"])] == []
    assert runs == [(0, "cancelled")], runs


@contextmanager
def cancel_mode() -> Iterator[None]:
    """QOS low's preemption as PreemptMode=cancel without grace, KillWait 30 s meanwhile."""
    with slurm_setting("KillWait", "30"), qos_setting("low", PreemptMode="cancel", GraceTime="0"):
        yield


@pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason=(
    "host's Slurm only (CI time): the lanes test the requeue from inside a run, which calls share, with the "
    "reference trainer (test_requeue_cluster)"))
def test_a_checkpointable_call_preempted_twice_loses_no_step(dev_cluster, isolated_ledger, tmp_path):
    """A guarded `Checkpointable` in the preemptible QOS, preempted by two high jobs: each notice stops it at a step
    boundary, its checkpoint() is the next run's call, rank 0 requeues the job, and it ends with every step run exactly
    once and the result of a run never preempted. The second preemption is under PreemptMode=cancel without grace
    (KillWait 30 s, as at most sites): the job sees a SIGTERM while COMPLETING, as after a scancel, which Slurm does
    not requeue; its PreemptTime tells rank 0 it is a preemption."""
    steps, progress = 120, tmp_path / "progress"
    ex = Executor(site="dev")
    ex.update_parameters(timeout_min=15, mem_gb=1, account="teama", preemptible=True, gpus_per_node=2,
                         name="guarded-loop")
    job = ex.submit(Loop(steps, progress))
    site = load_site("dev")
    with Ledger(isolated_ledger) as ledger:
        row = ledger.jobs.get(job.ledger_id)
        assert row["qos"] == "low"
        journal = Journal(Path(row["job_dir"]) / "journal")
        requeues = lambda: [r for _, r in journal.records(kinds=["requeue"])]  # noqa: E731
        for k, mode in ((1, nullcontext()), (2, cancel_mode())):
            done = len(progress.read_text().split()) if progress.exists() else 0
            wait_until(lambda: progress.exists() and len(progress.read_text().split()) >= done + 10, 120, 0.2,
                       f"run {k} to make progress")
            with mode:
                Submitter(site, ledger).submit(JobSpec.model_validate(HIGH), "<high>")
                wait_until(lambda: len(requeues()) == k, 120, 0.5, f"preemption {k} to requeue the call")
        result = job.result()
    ran = [int(x) for x in progress.read_text().split()]
    assert ran == list(range(1, steps + 1))  # no step lost, none run twice
    assert result["step"] == steps and result["total"] == steps * (steps + 1) // 2
    assert len(result["starts"]) == 3 and result["starts"][0] == 0
    assert [r["cause"] for r in requeues()] == ["preemption"] * 2
    listed = {r["id"]: r for r in json.loads(run_cli("status", "--all", "--json").stdout)}
    assert (listed[job.ledger_id]["restarts"], listed[job.ledger_id]["preemptions"]) == (2, 2)
