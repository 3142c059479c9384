"""Requeue this job (or only this array task) from inside it, after its checkpoint is committed.

Self-requeue matters on Slurm 22.05: under a QOS GraceTime, a batch script that exits by itself during
the grace ends COMPLETED or FAILED and Slurm does not requeue it. From 24.11 Slurm requeues such a
preempted job itself, and on 24.11 a self-requeue during the grace costs a third run: a preempted job
is then left to Slurm (see hpctrain.slurm.version).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Mapping

from hpctrain.config.types import parse_slurm_time
from hpctrain.contract import ATTEMPT_BASE_ENV, JobEnvironment
from hpctrain.errors import SlurmError
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.guard import JobNow
from hpctrain.slurm.client import SlurmClient


def job_now(client: SlurmClient, env: Mapping[str, str] = os.environ) -> JobNow | None:
    """State, requeue count and time-limit end of this run (one `scontrol show job`); None when unknown.

    The end is this run's start + its time limit, not Slurm's EndTime: preemption with a GraceTime
    moves that to the end of the grace."""
    try:
        # By task: an array's last task runs under the array's own id, which shows every task.
        job = client.show_job(JobEnvironment(env).requeue_target)
        limit = job.get("TimeLimit", "UNLIMITED")
        end = None if limit in ("UNLIMITED", "Partition_Limit") else \
            datetime.fromisoformat(job["StartTime"]).timestamp() + parse_slurm_time(limit)
        return JobNow(job.get("JobState"), int(job.get("Restarts", 0)), end,
                      preempted=job.get("PreemptTime", "None") not in ("None", "Unknown", ""))
    except (KeyError, ValueError, SlurmError):
        return None


def _secret_names(job: JobEnvironment) -> list[str]:
    """The job's secret names (this run has their values, from its secrets file: sbatch must not take them)."""
    from hpctrain import secret_file

    return secret_file.names(json.loads(job.spec_file.read_text(encoding="utf-8"))) if job.spec_file else []


def self_requeue(client: SlurmClient, env: Mapping[str, str] = os.environ) -> str:
    """`scontrol requeue` this job or task; where scontrol is unusable, submit a follow-up job that
    starts after this one ends. Returns what was done, for the journal."""
    job_env = JobEnvironment(env)
    target = job_env.requeue_target
    now = job_now(client, env)
    if now is not None and now.preempted:
        version = client.version()
        if version.requeues_preempted_exit:
            return f"left to Slurm {version}, which requeues the preempted {target} when it ends"
    try:
        client.requeue(target)
        return f"scontrol requeue {target}"
    except SlurmError as exc:
        if "pending execution" in str(exc):  # Slurm requeued it first (preemption without grace time)
            return f"already requeued by Slurm: {target}"
        if "not found" not in str(exc) or job_env.script is None:
            raise
    args = [f"--dependency=afterany:{job_env.slurm_job_id}"]
    if job_env.task_index >= 0:
        args.append(f"--array={job_env.task_index}")
    base = job_env.run_number + 1
    follow_up = client.sbatch(job_env.script.read_text(), env={ATTEMPT_BASE_ENV: str(base)}, args=tuple(args),
                              unset_env=_secret_names(job_env))
    journal = Journal.from_env()
    if journal is not None:  # so the ledger follows the job under its new id
        journal.write("resubmitted", new_slurm_job_id=follow_up, attempt_base=base,
                      message=f"follow-up job {follow_up} after {job_env.slurm_job_id}")
    return f"follow-up job {follow_up} after {job_env.slurm_job_id}"
