"""`hpctrain export mlflow|tensorboard`: the ledger's runs in the trackers teams use (imports only click at load)."""

from __future__ import annotations

from pathlib import Path

import click

from hpctrain.cli.common import require, site_option
from hpctrain.cli.types import LEDGER_ID

_jobs = click.argument("jobs", nargs=-1, type=LEDGER_ID, metavar="[JOB]...")
_sweep = click.option("--sweep", "sweep_id", metavar="SWEEP", default=None, help="the jobs of this sweep")
_since = click.option("--since", metavar="YYYY-MM-DD", default=None, help="the jobs submitted from this day on")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def export() -> None:
    """Export the ledger's jobs to MLflow or TensorBoard (default: every job of the site)."""


@export.command()
@_jobs
@_sweep
@_since
@click.option(
    "--tracking-uri",
    "uri",
    metavar="URI",
    default=None,
    help="an MLflow tracking server (http://...) or store (sqlite:///...); default $MLFLOW_TRACKING_URI, else "
    "mlflow.db beside the ledger",
)
@click.option("--experiment", default="hpctrain", show_default=True, help="the MLflow experiment of the runs")
@site_option
def mlflow(
    jobs: tuple[int, ...], sweep_id: str | None, since: str | None, uri: str | None, experiment: str, site: str | None
) -> None:
    """One MLflow run per job's task across its requeues: params, metrics by step and time, evaluation results,
    ledger and Slurm ids as tags; registry versions and aliases mirrored into MLflow's registry. Run it again
    (from cron too): it sends only what is new."""
    require("mlflow")
    from hpctrain.cli.common import open_site
    from hpctrain.errors import HpctrainError
    from hpctrain.trackers.mlflow_export import describe, export_mlflow
    from hpctrain.trackers.mlflow_uri import default_uri, parse
    from hpctrain.trackers.runs import chosen_jobs

    cfg, ledger, _ = open_site(site)
    with ledger:
        chosen = chosen_jobs(ledger, cfg.name, jobs, sweep_id, since)
        tracking = parse(uri if uri is not None else default_uri(ledger.path))
        sent = export_mlflow(ledger, chosen, tracking, experiment)
    click.echo(describe(sent, tracking))
    if sent.refused:
        raise HpctrainError(
            f"MLflow refused {len(sent.refused)} run(s), the others were sent: {'; '.join(sent.refused)}"
        )


@export.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@_jobs
@_sweep
@_since
@site_option
def tensorboard(
    directory: Path, jobs: tuple[int, ...], sweep_id: str | None, since: str | None, site: str | None
) -> None:
    """A TensorBoard run folder per job's task in DIRECTORY: metrics and evaluation results as scalars by step
    (`tensorboard --logdir DIRECTORY`). Exporting again rewrites each folder's events."""
    require("tensorboard")
    from hpctrain.cli.common import open_site
    from hpctrain.trackers.runs import chosen_jobs
    from hpctrain.trackers.tensorboard_export import export_tensorboard

    cfg, ledger, _ = open_site(site)
    with ledger:
        runs, scalars = export_tensorboard(ledger, chosen_jobs(ledger, cfg.name, jobs, sweep_id, since), directory)
    click.echo(f"TensorBoard runs in {directory}: {runs} ({scalars} scalars)")
