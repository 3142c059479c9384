"""Running a job (or one array task) again: from inside it after its checkpoint is committed
(`self_requeue`), and the one mechanism that and reconcile share (`run_again`).

Self-requeue matters on Slurm 22.05: under a QOS GraceTime, a batch script that exits by itself during
the grace ends COMPLETED or FAILED and Slurm does not requeue it. From 24.11 Slurm requeues such a
preempted job itself, and on 24.11 a self-requeue during the grace costs a third run: a preempted job
is then left to Slurm (see hpctrain.slurm.version).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from hpctrain.contract import ATTEMPT_BASE_ENV, JobEnvironment
from hpctrain.errors import HpctrainError, SlurmError
from hpctrain.ledger.journal import Journal
from hpctrain.runtime import secret_file
from hpctrain.runtime.guard import JobNow, PreemptionGuard, stop_signals_ignored
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.sacct import parse_time


def job_now(client: SlurmClient, env: Mapping[str, str] = os.environ) -> JobNow | None:
    """State, requeue count and time-limit end of this run (one `scontrol show job`); None when unknown.

    The end is this run's start + its time limit, not Slurm's EndTime: preemption with a GraceTime
    moves that to the end of the grace. A job that its preemption is ending (`_ended_by_its_preemption`) is asked its
    QOS's preempt mode too (`requeues_on_preemption`): under CANCEL its preemption ends it, as a scancel would look,
    and Slurm does not requeue it (measured on 22.05, 24.11 and 26.05, docs/slurm.md)."""
    from hpctrain.config.types import parse_slurm_time  # pydantic: not on 22.05's requeue path

    try:
        # By task: an array's last task runs under the array's own id, which shows every task.
        job = client.show_job(JobEnvironment(env).requeue_target)
        limit = job.get("TimeLimit", "UNLIMITED")
        end = (
            None
            if limit in ("UNLIMITED", "Partition_Limit")
            else datetime.fromisoformat(job["StartTime"]).timestamp() + parse_slurm_time(limit)
        )
        preempted_at = parse_time(job.get("PreemptTime", ""))
        now = JobNow(job.get("JobState"), int(job.get("Restarts", 0)), end, preempted_at is not None, job.get("QOS"))
        ended_by_preemption = _ended_by_its_preemption(now.state, preempted_at, parse_time(job.get("EndTime", "")))
    except (KeyError, ValueError, SlurmError):
        return None
    now.cancelled_by_preemption = ended_by_preemption and not requeues_on_preemption(client, now.qos)
    return now


def _ended_by_its_preemption(state: str | None, preempted_at: float | None, ended_at: float | None) -> bool:
    """Whether the job is ending because its preemption ends it, not a scancel inside the preemption's grace. Slurm
    sets PreemptTime again to the moment the preemption kills the job (at once without a GraceTime, else once the
    grace is out), the moment that kill gives EndTime; a scancel in the grace gives EndTime the moment of the cancel,
    after the notice's PreemptTime (slurmctld's preempt and job_signal, alike on 22.05 to 26.05). The two are a
    second apart at most when both are the kill's: a cancel that close to the notice counts as the preemption."""
    if preempted_at is None or state not in ("COMPLETING", "CANCELLED"):
        return False
    return ended_at is None or ended_at - preempted_at <= 1


def requeues_on_preemption(client: SlurmClient, qos: str | None) -> bool:
    """Whether a job preempted in ``qos`` is requeued by Slurm (its QOS's PreemptMode, or the cluster's where the QOS
    defers to it, is REQUEUE); under CANCEL it ends PREEMPTED. Unknown: False, so that hpctrain requeues it (a third
    run on 24.11 at worst, never a lost job)."""
    mode = "cluster"
    try:
        if qos:
            rows = client.sacctmgr("qos", f"name={qos}", fields="name,preemptmode")
            mode = next((r["preemptmode"] for r in rows if r["name"] == qos), "")
        if mode.lower() == "cluster":
            mode = client.features().preempt_mode
    except SlurmError:
        return False
    return "requeue" in mode.lower()


def rank0_probe(rank: int) -> Callable[[], JobNow | None]:
    """A guard's ``job_now`` (hpctrain.runtime.guard.PreemptionGuard) on ``rank``: rank 0 asks Slurm, no other does."""
    return (lambda: job_now(SlurmClient())) if rank == 0 else (lambda: None)


def _secret_names(job: JobEnvironment) -> list[str]:
    """The job's secret names (this run has their values, from its secrets file: sbatch must not take them)."""
    return secret_file.names(json.loads(job.spec_file.read_text(encoding="utf-8"))) if job.spec_file else []


@dataclass
class RunAgain:
    """What `run_again` did: requeued under the same Slurm id, or submitted the script again (``new_id``)."""

    how: str
    new_id: str | None = None


def run_again(
    client: SlurmClient,
    target: str,
    script: Path | None,
    next_run: int,
    after: str | None = None,
    task_index: int = -1,
    unset_env: Iterable[str] = (),
    exclude: list[str] | None = None,
) -> RunAgain:
    """The one way hpctrain runs a job (or one array task) again, from inside it or from reconcile:
    `scontrol requeue` while Slurm holds it; where Slurm no longer knows it and ``script`` is given, the
    same script again under a new id (after job ``after`` ends; as array task ``task_index``), its runs
    numbered on from ``next_run``; secrets in ``unset_env`` stay out of sbatch's environment; the next runs
    keep off the nodes in ``exclude``."""
    try:
        client.requeue(target)
        return RunAgain(f"scontrol requeue {target}" + _keep_off(client, target, exclude or []))
    except SlurmError as exc:
        text = str(exc).lower()
        if "pending execution" in text:  # Slurm requeued it first (preemption without grace time)
            return RunAgain(f"already requeued by Slurm: {target}")
        if script is None or not ("invalid job id" in text or "not found" in text):
            raise
    args = ([f"--dependency=afterany:{after}"] if after else []) + (
        [f"--array={task_index}"] if task_index >= 0 else []
    )
    args += [f"--exclude={','.join(exclude)}"] if exclude else []
    new_id = client.sbatch(
        script.read_text(), env={ATTEMPT_BASE_ENV: str(next_run)}, args=tuple(args), unset_env=unset_env
    )
    return RunAgain(
        f"Slurm no longer holds {target}: submitted again as {new_id}" + (f" (after {after} ends)" if after else ""),
        new_id,
    )


def _keep_off(client: SlurmClient, target: str, nodes: list[str]) -> str:
    """Set a requeued job's ExcNodeList (Slurm changes no running job's); what was done, for the journal."""
    if not nodes:
        return ""
    try:
        client.exclude_nodes(target, nodes)
    except SlurmError as exc:
        return f"; its next run may land on {','.join(nodes)} again: {exc}"
    return f", ExcNodeList={','.join(nodes)}"


def self_requeue(client: SlurmClient, env: Mapping[str, str] = os.environ, exclude: list[str] | None = None) -> str:
    """Run this job or task again after this run (`run_again`; off the nodes in ``exclude``), unless Slurm will.
    Returns what was done, for the journal."""
    job_env = JobEnvironment(env)
    target = job_env.requeue_target
    version = client.version()
    if (
        version.requeues_preempted_exit
        and (now := job_now(client, env)) is not None
        and now.preempted
        and requeues_on_preemption(client, now.qos)
    ):
        return f"left to Slurm {version}, which requeues the preempted {target} when it ends"
    base = job_env.run_number + 1
    done = run_again(
        client,
        target,
        job_env.script,
        base,
        after=job_env.slurm_job_id,
        task_index=job_env.task_index,
        unset_env=_secret_names(job_env),
        exclude=exclude,
    )
    journal = Journal.from_env()
    if done.new_id is not None and journal is not None:  # so the ledger follows the job under its new id
        journal.write("resubmitted", new_slurm_job_id=done.new_id, attempt_base=base, message=done.how)
    return done.how


def requeues(guard: PreemptionGuard) -> bool:
    """Whether a run stopped by ``guard``'s notice is requeued from inside it (not after a cancel)."""
    return JobEnvironment().in_slurm and guard.cause() != "cancelled"


def requeue_after_stop(guard: PreemptionGuard, message: str, **record: object) -> None:
    """Rank 0, once its checkpoint is saved after a stop notice: journal the stop and requeue the job at
    once, as `requeues` says. Slurm's requeue delay starts now, not after the job step and the batch
    script's bookkeeping have ended. The stop is journaled before the requeue (``requeue``) and what the requeue did
    after it (``requeued``, or ``requeue_failed``): a run with the one and neither of the others was killed half-way,
    and `hpctrain attempt end` (or reconcile, where the batch script died with it) decides and requeues in its place,
    as when this failed. The Slurm commands run with the stop signals ignored (`stop_signals_ignored`)."""
    with stop_signals_ignored():
        if not requeues(guard):
            return  # the batch script records how the run ended
        journal = Journal.from_env()
        # Recorded before requeueing: the requeue ends this process.
        if journal is not None:
            journal.write(
                "requeue",
                message=message,
                cause=guard.cause(),
                signal=guard.signal,
                signal_at=guard.received_at,
                **record,
            )
        try:
            how = self_requeue(SlurmClient())
        # e.g. Slurm not answering, the job's script unreadable: the batch script's `attempt end` tries again
        except (HpctrainError, OSError, ValueError) as exc:
            if journal is not None:
                journal.write("requeue_failed", message=str(exc), step=record.get("step"))
            return
        if journal is not None:
            journal.write("requeued", message=how, step=record.get("step"))
