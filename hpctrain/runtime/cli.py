"""`hpctrain attempt start|end`: the batch script's bookkeeping around its job step (compute node side).

Both journal what they find (never the ledger: compute nodes do not open it) and must stay fast:
`end` may run between SIGTERM and SIGKILL.
"""

from __future__ import annotations

import json
import os
import sys

import click

# `attempt start` exits with this when the run must not go on; the batch script exits with it too.
REFUSED = 3


def _context() -> tuple[object, dict, int]:
    from hpctrain.ledger.journal import Journal, job_context

    journal = Journal.from_env()
    if journal is None:
        raise click.UsageError("not inside an hpctrain batch script ($HPCTRAIN_JOURNAL_DIR is not set)")
    spec_file = os.environ.get("HPCTRAIN_SPEC")
    spec = json.loads(open(spec_file, encoding="utf-8").read()) if spec_file else {}
    return journal, spec, job_context()["task_index"]


def _policy(spec: dict) -> dict:
    retry = spec.get("retry") or {}
    return {"requeue": spec.get("requeue", True), "on_error": retry.get("on_error", False),
            "max_stalled": retry.get("max_stalled_attempts", 3)}


@click.group(hidden=True)
def attempt() -> None:
    """Record the start and end of this run of the job (used by hpctrain's batch scripts)."""


@attempt.command()
def start() -> None:
    """Journal this run's number and starting checkpoint step; print the number. Exits 3 when the job
    should not run again (Slurm requeued it by itself past the requeue cap)."""
    from hpctrain.ledger.journal import run_number
    from hpctrain.runtime.attempts import checkpoint_dir, decide, fill_end_steps, journal_outcomes, latest_committed_step

    journal, spec, task = _context()
    number = run_number(os.environ)
    history = [o for n, o in journal_outcomes(journal, task).items() if n < number]
    step = latest_committed_step(checkpoint_dir(spec, task))
    journal.write("attempt_start", attempt=number, step=step)
    # A previous run that ended without its own record was requeued by Slurm (preemption with no grace,
    # node failure): the cap still applies. A run after a recorded stop was requeued by a person: it runs.
    if history and history[-1].cause is None:
        history[-1].cause = "requeued"
        go, why = decide(fill_end_steps(history, step), **_policy(spec))
        if not go:
            journal.write("attempt_end", attempt=number, cause="refused", step_end=step, exit_code=REFUSED,
                          requeued=False, message=why)
            _forget_secrets(task)
            click.echo(f"hpctrain: not running: {why}", err=True)
            sys.exit(REFUSED)
    click.echo(number)


@attempt.command()
@click.option("--exit-code", type=int, required=True, help="the job step's exit status")
@click.option("--signal", "signal_name", default=None, help="the stop signal the batch shell received, if any")
def end(exit_code: int, signal_name: str | None) -> None:
    """Journal how this run ended; requeue the job (or only this array task) when the policy says so."""
    from hpctrain.errors import HpctrainError
    from hpctrain.ledger.journal import run_number
    from hpctrain.runtime.attempts import Outcome, checkpoint_dir, decide, journal_outcomes, latest_committed_step

    journal, spec, task = _context()
    number = run_number(os.environ)
    runs = journal_outcomes(journal, task)
    this = runs.setdefault(number, Outcome(None))
    if this.cause not in (None, "completed"):
        return  # the trainer checkpointed and requeued this run itself; Slurm is ending it
    if this.cause == "completed" and exit_code == 0:  # the trainer ran its last step: a notice came too late
        requeued_by_slurm = False
    else:
        this.cause, requeued_by_slurm = _cause(exit_code, signal_name)
    this.step_end = latest_committed_step(checkpoint_dir(spec, task))
    go, why = decide([o for n, o in runs.items() if n <= number], **_policy(spec))
    if go and requeued_by_slurm:
        why = f"{this.cause}; requeued by Slurm"
    journal.write("attempt_end", attempt=number, cause=this.cause, step_end=this.step_end, exit_code=exit_code,
                  signal=signal_name, requeued=go, message=why)
    if not go and not requeued_by_slurm:
        _forget_secrets(task)
    if this.cause != "completed":  # the job's log stays the job's own when all went well
        click.echo(f"hpctrain: run {number} ended ({this.cause}, exit {exit_code}): {why}", err=True)
    if go and not requeued_by_slurm and "SLURM_JOB_ID" in os.environ:
        from hpctrain.runtime import self_requeue
        from hpctrain.slurm import SlurmClient

        try:
            self_requeue(SlurmClient())
        except HpctrainError as exc:
            journal.write("requeue_failed", message=str(exc), attempt=number)
            raise


def _forget_secrets(task: int) -> None:
    """This run is the job's last: remove its secrets file. An array task leaves it to the others (the
    login side removes it once the whole array has ended)."""
    job_id = os.environ.get("HPCTRAIN_JOB_ID")
    if task < 0 and job_id:
        from hpctrain.submit import secret_file

        secret_file.remove(os.environ.get("HPCTRAIN_JOB_DIR"), job_id)


def _cause(exit_code: int, signal_name: str | None) -> tuple[str, bool]:
    """(completed, error, or after a stop signal timeout, cancelled or preemption told by the job's state;
    whether Slurm has requeued the job already)."""
    if not signal_name:
        return ("completed" if exit_code == 0 else "error"), False
    from hpctrain.runtime import job_now
    from hpctrain.runtime.guard import stop_cause, timeout_margin_s
    from hpctrain.slurm import SlurmClient

    now, restarts = job_now(SlurmClient()), int(os.environ.get("SLURM_RESTART_COUNT", 0))
    requeued = now is not None and now.restarts is not None and now.restarts > restarts
    return stop_cause(now, restarts, timeout_margin_s()), requeued
