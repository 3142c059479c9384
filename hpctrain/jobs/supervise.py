"""Requeue runs that died without a word (killed batch shell, OOM kill, node failure without requeue).

A run that ends normally decides for itself in its batch script (`hpctrain attempt end`); one that
could not leaves its last attempt undecided in the ledger. `hpctrain reconcile` then applies the
same policy from the login node: `scontrol requeue` while Slurm still holds the job, else (a plain
job) a fresh sbatch of the same script under a new Slurm id, its attempts numbered on.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import AttemptRow, JobRow
from hpctrain.runtime import secret_file
from hpctrain.runtime.attempts import Outcome, RunPolicy, fill_end_steps, latest_committed_step
from hpctrain.runtime.requeue import run_again
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import DIED, NO_MORE_RUNS, TERMINAL, array_state


@dataclass
class Decision:
    job_id: int
    task_index: int
    requeued: bool
    why: str


def supervise(ledger: Ledger, client: SlurmClient, site: str) -> list[Decision]:
    """Decide every dead run whose last attempt nobody has decided on yet; returns what was done. The runs that
    need no decision (followed by another, or of a job that runs no more) are marked decided first."""
    ledger.attempts.decide_left_over(site, NO_MORE_RUNS)
    if not ledger.jobs.may_have_undecided_deaths(site):
        return []  # the usual answer: nothing died since the last supervision decided every death
    decisions = [
        _decide(ledger, client, ledger.jobs.known(job_id), task, ledger.attempts.of_task(job_id, task))
        for job_id, task in ledger.jobs.undecided_deaths(site, DIED)
    ]
    ledger.jobs.no_undecided_deaths(site, DIED)
    return decisions


def _decide(ledger: Ledger, client: SlurmClient, job: JobRow, task: int, attempts: list[AttemptRow]) -> Decision:
    policy = RunPolicy.of(json.loads(job["spec_json"] or "{}"))
    outcomes = fill_end_steps(
        [Outcome(a["cause"], a["step_start"], a["step_end"]) for a in attempts],
        latest_committed_step(policy.checkpoint_dir(task)),
    )
    go, why = policy.decide(outcomes)
    if go:
        try:
            why = f"{why} by reconcile: {_run_again(ledger, client, job, task, len(attempts))}"
        except HpctrainError as exc:  # Slurm down, a secret missing: left undecided, the next reconcile tries again
            return Decision(job["id"], task, False, f"requeue failed, will retry: {exc}")
    last = attempts[-1]
    with ledger.transaction():
        ledger.attempts.record(
            job["id"], task, last["attempt"], step_end=outcomes[-1].step_end, requeued=int(go), decision=why
        )
        if go:
            _mark_requeued(ledger, job, task)
        ledger.event(
            "requeue" if go else "stopped",
            why,
            job_id=job["id"],
            task_index=task,
            attempt=last["attempt"],
            cause=last["cause"],
        )
    if not go and (task < 0 or not ledger.jobs.unsettled_tasks(job["id"], TERMINAL, DIED)):
        secret_file.remove(job["job_dir"], job["id"])  # the job will not run again
    return Decision(job["id"], task, go, why)


def _run_again(ledger: Ledger, client: SlurmClient, job: JobRow, task: int, attempts: int) -> str:
    slurm_id, script, job_dir = job["slurm_job_id"], job["script_path"], job["job_dir"]
    if slurm_id is None or script is None or job_dir is None:
        raise HpctrainError(f"job {job['id']} has no Slurm id, batch script or directory in the ledger")
    target = slurm_id + (f"_{task}" if task >= 0 else "")
    secret_names = _keep_secrets_file(job, job_dir, target)
    # A plain job Slurm has forgotten (past MinJobAge) runs its script again under a new id; an array task
    # cannot be submitted alone under its array's id.
    done = run_again(client, target, Path(script) if task < 0 else None, attempts, unset_env=secret_names)
    if done.new_id is not None:
        ledger.jobs.resubmitted(job["id"], done.new_id, attempts)
    return done.how


def _keep_secrets_file(job: JobRow, job_dir: str, target: str) -> list[str]:
    """The job's secret names, its secrets file there (in ``job_dir``) for the next run: the one written at submit,
    else one written now from this environment."""
    names = secret_file.names(json.loads(job["spec_json"] or "{}"))
    if not names or secret_file.path(job_dir, job["id"]).exists():
        return names
    missing = sorted(k for k in names if os.environ.get(k) is None)
    if missing:
        raise HpctrainError(
            f"job {target} has no secrets file left, and running it again needs the secret(s) "
            f"{', '.join(missing)} in this environment"
        )
    secret_file.write(job_dir, job["id"], {k: os.environ[k] for k in names})
    return names


def _mark_requeued(ledger: Ledger, job: JobRow, task: int) -> None:
    """Active again, so the next poll follows it (its old run may still be sacct's last for a moment)."""
    if task < 0:
        ledger.jobs.set_state(job["id"], "REQUEUED", ended_at=None)
        return
    ledger.jobs.set_task_state(job["id"], task, "REQUEUED")
    ledger.jobs.set_state(job["id"], array_state(list(ledger.jobs.task_states(job["id"]).values())), ended_at=None)
