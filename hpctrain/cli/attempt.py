"""`hpctrain attempt start|restart|end`: the batch script's bookkeeping around its job step (compute node side).

Both journal what they find (never the ledger: compute nodes do not open it) and must stay fast:
`end` may run between SIGTERM and SIGKILL.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from hpctrain.cli.types import MAX_INT, whole

# `attempt start` exits with this when the run must not go on; the batch script exits with it too.
REFUSED = 3
# ... and with this when the job's work is done already (a run Slurm started on its own): the batch script exits 0.
DONE = 4


def _context() -> tuple[Any, Any, Any]:
    """This run's journal, the job's run policy and its environment."""
    from hpctrain.contract import JOURNAL_ENV, JobEnvironment
    from hpctrain.ledger.journal import Journal
    from hpctrain.runtime.attempts import RunPolicy

    env = JobEnvironment()
    if env.journal_dir is None:
        raise click.UsageError(f"not inside an hpctrain batch script (${JOURNAL_ENV} is not set)")
    return Journal(env.journal_dir), RunPolicy.of_job(env), env


def _log_position() -> dict[str, Any]:
    """The job's log (Slurm's --output file, this process's stderr) and its size now: where this run's lines begin
    (`hpctrain logs` marks it). Nothing when stderr is not a file."""
    import os
    import stat
    from pathlib import Path

    try:
        log = os.fstat(2)
        if stat.S_ISREG(log.st_mode):
            return {"log": Path(os.readlink("/proc/self/fd/2")).name, "log_offset": log.st_size}
    except OSError:
        pass
    return {}


@click.group(hidden=True)
def attempt() -> None:
    """Record the start and end of this run of the job (used by hpctrain's batch scripts)."""


@attempt.command()
def start() -> None:
    """Journal this run's number and starting checkpoint step; print the number. Exits 3 when the job
    should not run again (Slurm requeued it by itself past the requeue cap), 4 when its work is done already
    (Slurm ran it again on its own after a run completed it)."""
    from hpctrain.runtime.attempts import fill_end_steps, journal_outcomes, latest_committed_step, rerun_of_completed

    journal, policy, env = _context()
    task, number = env.task_index, env.run_number
    earlier = {n: o for n, o in journal_outcomes(journal, task).items() if n < number}
    history = list(earlier.values())
    step = latest_committed_step(policy.checkpoint_dir(task))
    journal.write("attempt_start", attempt=number, step=step, **_log_position())
    if env.race_file is not None and env.slurm_job_id is not None and env.job_id is not None:
        _race(journal, env.race_file, env.job_id, env.slurm_job_id, number, step)
    if (why := rerun_of_completed(earlier)) is not None:
        journal.write(
            "attempt_end", attempt=number, cause="rerun", step_end=step, exit_code=0, requeued=False, message=why
        )
        click.echo(f"hpctrain: not running again: {why}", err=True)
        sys.exit(DONE)
    # A previous run that ended without its own record was requeued by Slurm (preemption with no grace,
    # node failure): the cap still applies. A run after a recorded stop was requeued by a person: it runs.
    if history and history[-1].cause is None:
        history[-1].cause = "requeued"
        go, why = policy.decide(fill_end_steps(history, step))
        if not go:
            journal.write(
                "attempt_end",
                attempt=number,
                cause="refused",
                step_end=step,
                exit_code=REFUSED,
                requeued=False,
                message=why,
            )
            _forget_secrets(env)
            _release_chunks(env)
            click.echo(f"hpctrain: not running: {why}", err=True)
            sys.exit(REFUSED)
    click.echo(number)


@attempt.command()
@click.option("--exit-code", type=whole(-MAX_INT - 1), required=True, help="the job step's exit status")
@click.option("--signal", "signal_name", default=None, help="the stop signal the batch shell received, if any")
def end(exit_code: int, signal_name: str | None) -> None:
    """Journal how this run ended; requeue the job (or only this array task) when the policy says so."""
    from hpctrain.errors import HpctrainError
    from hpctrain.runtime.attempts import Outcome, journal_outcomes, latest_committed_step

    journal, policy, env = _context()
    task, number = env.task_index, env.run_number
    _journal_hang(journal, env)
    runs = journal_outcomes(journal, task)
    this = runs.setdefault(number, Outcome(None))
    if this.cause == "idle":  # its GPU sampler ended it for good (hpctrain.runtime.idle_cancel)
        _forget_secrets(env)
        _release_chunks(env)
        click.echo(f'hpctrain: run {number} ended: its GPUs stayed idle ([idle] action = "cancel")', err=True)
        return
    if this.cause not in (None, "completed") and not this.requeue_failed:
        return  # the trainer checkpointed and requeued this run itself; Slurm is ending it
    exclude: list[str] = []
    if this.requeue_failed:  # the trainer stopped on a notice and checkpointed, but could not requeue: this shell does
        this.cause, requeued_by_slurm = _cause_after_failed_requeue(this.cause, env)
    elif this.cause == "completed" and exit_code == 0:  # the trainer ran its last step: a notice came too late
        requeued_by_slurm = False
    else:
        this.cause, requeued_by_slurm = _cause(exit_code, signal_name, env.restart_count)
    # `restart` waited for silent nodes already; `end` may run between SIGTERM and SIGKILL: it asks once.
    if this.cause == "error" and (nodes := _step_nodes(policy, env, wait=False)) is not None and not nodes.enough:
        this.cause, exclude = "node_failure", sorted(nodes.lost())  # a next run keeps off the nodes left out
    this.step_end = latest_committed_step(policy.checkpoint_dir(task))
    go, why = policy.decide([o for n, o in runs.items() if n <= number])
    if go and requeued_by_slurm:
        why = f"{this.cause}; requeued by Slurm"
    if go and exclude:
        why += f", without {','.join(exclude)}"
    if go and this.requeue_failed and not requeued_by_slurm:
        why += " (the trainer's own requeue failed: asked again by the batch script)"
    requeue_follows = go and not requeued_by_slurm and env.in_slurm
    journal.write(
        "attempt_end",
        attempt=number,
        cause=this.cause,
        step_end=this.step_end,
        exit_code=exit_code,
        signal=signal_name,
        requeued=go,
        message=why,
        **({"excluded": exclude} if exclude else {}),
        **({"requeue_follows": True} if requeue_follows else {}),
    )
    if not go and not requeued_by_slurm:
        _forget_secrets(env)
        _release_chunks(env)
    if this.cause != "completed":  # the job's log stays the job's own when all went well
        click.echo(f"hpctrain: run {number} ended ({this.cause}, exit {exit_code}): {why}", err=True)
    if requeue_follows:
        from hpctrain.runtime import self_requeue
        from hpctrain.slurm import SlurmClient

        try:
            how = self_requeue(SlurmClient(), exclude=exclude)
        except HpctrainError as exc:
            journal.write("requeue_failed", message=str(exc), attempt=number)
            raise
        journal.write("requeued", message=how, attempt=number)


@attempt.command()
@click.option("--exit-code", type=whole(-MAX_INT - 1), required=True, help="the failed job step's exit status")
def restart(exit_code: int) -> None:
    """Exit 0 when the failed job step should start again inside this allocation (the spec's retry.in_place),
    after journaling the restart and the checkpoint step it resumes from; exit 1 when the run ends instead."""
    from hpctrain.runtime.attempts import journal_outcomes, latest_committed_step

    journal, policy, env = _context()
    task, number, done = env.task_index, env.run_number, env.step_restarts
    stopped = journal_outcomes(journal, task).get(number)  # the trainer checkpointed and requeued, or finished
    if exit_code == 0 or done >= policy.in_place or (stopped is not None and stopped.cause is not None):
        sys.exit(1)
    _journal_hang(journal, env)  # the run's last step has `end` journal it
    nodes = _step_nodes(policy, env)
    if nodes is not None and not nodes.enough:
        click.echo(f"hpctrain: no restart in this allocation: {nodes.describe()}", err=True)
        sys.exit(1)
    step = latest_committed_step(policy.checkpoint_dir(task))
    why = (
        f"the job step failed (exit {exit_code}): restart {done + 1} of {policy.in_place} in this allocation, "
        + (f"from checkpoint step {step}" if step is not None else "from its own checkpoints, if any")
        + (" or a newer one in the memory tier" if policy.memory_tier else "")
        + (f", {nodes.describe()}" if nodes is not None else "")
    )
    journal.write(
        "step_restart",
        attempt=number,
        step_restart=done + 1,
        exit_code=exit_code,
        step=step,
        message=why,
        **({"nodes": nodes.chosen, "left_out": nodes.lost()} if nodes is not None else {}),
    )
    click.echo(f"hpctrain: {why}", err=True)


def _race(journal: Any, race_file: Any, job_id: int, slurm_job_id: str, number: int, step: int | None) -> None:
    """Run on only if this job wins its race (`submit --race`); else journal why, cancel this job (its siblings'
    poll would) and exit DONE, which every batch script, a site's own included, takes as "exit 0"."""
    from hpctrain.errors import SlurmError
    from hpctrain.runtime.race import claim
    from hpctrain.slurm.client import SlurmClient

    try:
        if claim(race_file, job_id):
            return
        winner = race_file.read_text().strip()
    except OSError as exc:  # the race cannot be decided: running the command twice is worse than not at all
        winner = f"an unknown runner ({exc.strerror})"
    why = f"lost the race to {winner}: another placement started first"
    journal.write(
        "attempt_end", attempt=number, cause="race_lost", step_end=step, exit_code=0, requeued=False, message=why
    )
    click.echo(f"hpctrain: not running: {why}", err=True)
    try:
        SlurmClient().scancel([slurm_job_id])
    except SlurmError:
        pass  # it ends by itself now; a poll sees its end
    sys.exit(DONE)


def _step_nodes(policy: Any, env: Any, wait: bool = True) -> Any:
    """The nodes a step started now would run on (hpctrain.launch.nodes), in a job that restarts its step in the
    allocation; None elsewhere, and when Slurm does not answer (the step's launch asks again). Without ``wait``,
    nodes that miss the controller's pings are not waited for."""
    if not (policy.in_place and env.in_slurm):
        return None
    from hpctrain.errors import HpctrainError
    from hpctrain.launch.nodes import SILENT_WAIT_S, step_nodes
    from hpctrain.slurm import SlurmClient

    try:
        return step_nodes(
            SlurmClient(), policy.nodes, env, SILENT_WAIT_S if wait else 0.0, exclude_after=policy.exclude_node_after
        )
    except HpctrainError as exc:
        click.echo(f"hpctrain: cannot tell which nodes are left: {exc}", err=True)
        return None


def _journal_hang(journal: Any, env: Any) -> None:
    """Journal (and log) the ranks of the step that just ended which the watchdog found hung, if any."""
    from hpctrain.runtime.watchdog import unreported_hang

    report = unreported_hang(journal, env)
    if report:
        journal.write("hang", attempt=env.run_number, step_restart=env.step_restarts, message=report)
        click.echo(f"hpctrain: {report}", err=True)


def _forget_secrets(env: Any) -> None:
    """This run is the job's last: remove its secrets file. An array task leaves it to the others (the
    login side removes it once the whole array has ended)."""
    if env.task_index < 0 and env.job_id is not None and env.job_dir is not None:
        from hpctrain.runtime import secret_file

        secret_file.remove(env.job_dir, env.job_id)


def _release_chunks(env: Any) -> None:
    """This array task has ended for good: the next chunk of a throttled submission split past MaxArraySize may
    use its slot (hpctrain.runtime.chunks). If that fails the next chunk starts when this one has ended."""
    if env.task_index < 0 or env.job_dir is None:
        return
    from hpctrain.contract import JobPaths
    from hpctrain.errors import HpctrainError
    from hpctrain.runtime.chunks import task_ended
    from hpctrain.slurm import SlurmClient

    try:
        task_ended(JobPaths(env.job_dir), env.param_index, env.requeue_target, SlurmClient())
    except (HpctrainError, OSError) as exc:
        click.echo(f"hpctrain: could not let the next chunk of this array start early: {exc}", err=True)


# A step's exit status when a stop signal killed it (128 + SIGTERM, 128 + SIGHUP).
KILLED_BY_STOP = (143, 129)


def _cause(exit_code: int, signal_name: str | None, restarts: int) -> tuple[str, bool]:
    """(completed, error, or after a stop signal timeout, cancelled or preemption told by the job's state;
    whether Slurm has requeued the job already). A step killed by SIGTERM or SIGHUP before the batch shell got its
    own (scancel and `scontrol requeue` signal every process of the job, in no set order) ended by the cancel or
    requeue if the job is ending, by its own failure if not."""
    if not signal_name and exit_code not in KILLED_BY_STOP:
        return ("completed" if exit_code == 0 else "error"), False
    from hpctrain.runtime.guard import stop_cause, timeout_margin_s

    now, requeued = _slurm_now(restarts)
    cause = stop_cause(now, restarts, timeout_margin_s())
    if not signal_name and not requeued:
        return ("cancelled" if cause == "cancelled" else "error"), False
    return cause, requeued


def _cause_after_failed_requeue(cause: str | None, env: Any) -> tuple[str | None, bool]:
    """A run whose trainer could not requeue it after a notice: its cause (the trainer's, unless the job is being
    cancelled now: the requeue may have failed for that) and whether Slurm has requeued it since."""
    if not env.in_slurm:
        return cause, False
    from hpctrain.runtime.guard import stop_cause, timeout_margin_s

    now, requeued = _slurm_now(env.restart_count)
    return ("cancelled" if stop_cause(now, env.restart_count, timeout_margin_s()) == "cancelled" else cause), requeued


def _slurm_now(restarts: int) -> tuple[Any, bool]:
    """The job as Slurm sees it now (`hpctrain.runtime.job_now`; None when unknown), and whether Slurm has requeued
    it since this run, its ``restarts``-th, started."""
    from hpctrain.runtime import job_now
    from hpctrain.slurm import SlurmClient

    now = job_now(SlurmClient())
    return now, now is not None and now.restarts is not None and now.restarts > restarts
