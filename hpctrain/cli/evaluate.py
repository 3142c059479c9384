"""`hpctrain eval JOB`: evaluation jobs on a job's checkpoints (imports only click at module load)."""

from __future__ import annotations

import click

from hpctrain.cli.common import site_option


@click.command(name="eval")
@click.argument("job", type=click.IntRange(min=1))
@click.option("--step", "steps", type=click.IntRange(min=0), multiple=True, help="this checkpoint step (repeatable)")
@click.option("--all", "every", is_flag=True, help="every committed checkpoint (default: the newest)")
@click.option(
    "--evaluator",
    "names",
    multiple=True,
    metavar="NAME",
    help="heldout (the reference GPT's held-out loss) or one of the spec's [eval] evaluators (repeatable; "
    "default: all of them)",
)
@click.option("--gpus", type=click.IntRange(min=0), default=1, show_default=True, help="GPUs of each evaluation job")
@site_option
def evaluate(
    job: int, steps: tuple[int, ...], every: bool, names: tuple[str, ...], gpus: int, site: str | None
) -> None:
    """Evaluate JOB's committed checkpoints, each in a Slurm job of its own (the preemptible QOS; requeued like any
    job), once per checkpoint and evaluator: the results land in the ledger (`hpctrain show JOB`)."""
    from hpctrain.cli.common import open_site
    from hpctrain.evaluate.submit import request

    if steps and every:
        raise click.UsageError("give --step or --all, not both")
    cfg, ledger, _ = open_site(site)
    with ledger:
        for r in request(ledger, cfg, job, steps or None, every, names, gpus):
            t = r.target
            what = f"step {t.step}" + (f" (task {t.task_index})" if t.task_index >= 0 else "") + f" with {r.evaluator}"
            if r.eval_job_id is None:
                click.echo(f"{what}: asked for before (see `hpctrain show {job}`)")
            else:
                click.echo(f"{what}: submitted, ledger id {r.eval_job_id}")
