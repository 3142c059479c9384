"""`hpctrain eval JOB`: evaluation jobs on a job's checkpoints (imports only click at module load)."""

from __future__ import annotations

from typing import Any

import click

from hpctrain.cli.common import site_option
from hpctrain.cli.types import INDEX, Finite, whole


@click.command(name="eval")
@click.argument("target", metavar="JOB|CHECKPOINT")
@click.option("--step", "steps", type=INDEX, multiple=True, help="this checkpoint step (repeatable)")
@click.option("--all", "every", is_flag=True, help="every committed checkpoint (default: the newest)")
@click.option(
    "--evaluator",
    "names",
    multiple=True,
    metavar="NAME",
    help="heldout (the reference GPT's held-out loss) or one of the spec's [eval] evaluators (repeatable; "
    "default: all of them)",
)
@click.option("--gpus", type=whole(0), default=1, show_default=True, help="GPUs of each evaluation job")
@click.option(
    "--follow",
    is_flag=True,
    help="evaluate each checkpoint as the job commits it, newest first, [eval] max_pending at a time, until the "
    "job has ended and every checkpoint is asked for",
)
@click.option("--interval", type=Finite(1, 86400), default=30, show_default=True, help="with --follow: seconds")
@click.option(
    "--retry",
    is_flag=True,
    help="ask again for the evaluations that failed or expired (of the --step/--evaluator given; without --step or "
    "--all: every failed one of the job)",
)
@site_option
def evaluate(
    target: str,
    steps: tuple[int, ...],
    every: bool,
    names: tuple[str, ...],
    gpus: int,
    follow: bool,
    interval: float,
    retry: bool,
    site: str | None,
) -> None:
    """Evaluate JOB's committed checkpoints (or the CHECKPOINT directory a job of the ledger wrote), each in a Slurm
    job of its own (the preemptible QOS; requeued like any job), once per checkpoint and evaluator: the results land
    in the ledger (`hpctrain show JOB`). One that failed or expired is asked again with --retry."""
    from pathlib import Path

    from hpctrain.cli.common import find_job, open_site
    from hpctrain.evaluate.submit import checkpoint_of, request

    if sum(map(bool, (steps, every, follow))) > 1:
        raise click.UsageError("give one of --step, --all and --follow")
    by_path = not (target.isascii() and target.isdigit())
    if by_path and (steps or every or follow):
        raise click.UsageError("a CHECKPOINT is one step: --step, --all and --follow go with a JOB")
    if follow and (names or gpus != 1 or retry):
        raise click.UsageError("--follow evaluates with the spec's evaluators, on one GPU each (not --retry)")
    cfg, ledger, client = open_site(site)
    with ledger:
        job, task, step = (
            checkpoint_of(ledger, Path(target)) if by_path else (find_job(ledger, target)["id"], None, None)
        )
        steps = (step,) if step is not None else steps
        if follow:
            _follow(ledger, cfg, client, job, interval)
            return
        for r in request(ledger, cfg, job, steps or None, every, names, gpus, task, retry):
            _echo(r, job)


def _echo(r: Any, job: int) -> None:
    t = r.target
    what = f"step {t.step}" + (f" (task {t.task_index})" if t.task_index >= 0 else "") + f" with {r.evaluator}"
    if r.eval_job_id is None and r.before == "failed":
        retry = f"hpctrain eval {job} --step {t.step} --evaluator {r.evaluator} --retry"
        click.echo(f"{what}: asked for before and failed (see `hpctrain show {job}`; `{retry}` asks again)")
    elif r.eval_job_id is None:
        click.echo(f"{what}: asked for before, {r.before} (see `hpctrain show {job}`)")
    else:
        click.echo(f"{what}: submitted, ledger id {r.eval_job_id}")


def _follow(ledger: Any, cfg: Any, client: Any, job: int, interval: float) -> None:
    """Reconcile, submit what is due, wait; until the job has ended and nothing is left to ask for."""
    import time

    from hpctrain.cli.common import find_job
    from hpctrain.evaluate.submit import follow, recover, unasked
    from hpctrain.jobs.reconcile import reconcile
    from hpctrain.slurm.states import TERMINAL

    find_job(ledger, str(job))
    while True:
        reconcile(ledger, client, cfg.name)
        recover(ledger, client)  # a submission killed before: its job found in Slurm, or asked for again
        for r in follow(ledger, cfg, job, always=True):
            _echo(r, job)
        if ledger.jobs.known(job)["state"] in TERMINAL and not unasked(ledger, job):
            click.echo(f"job {job} has ended and every committed checkpoint is asked for (see `hpctrain show {job}`)")
            return
        time.sleep(interval)
