"""`hpctrain ledger archive|vacuum`: keep a years-old ledger file small (the work is hpctrain.ledger.archive)."""

from __future__ import annotations

from pathlib import Path

import click

from hpctrain.cli.common import site_option
from hpctrain.cli.output import visible
from hpctrain.cli.types import Finite


@click.group()
def ledger() -> None:
    """Maintain the ledger file."""


@ledger.command()
@click.option(
    "--older-than",
    "days",
    type=Finite(0),
    default=365.0,
    show_default=True,
    help="move the jobs that ended more than this many days ago",
)
@click.option(
    "--to",
    "target",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="the archive ledger (made if missing); default: beside the ledger, <name>-archive.db",
)
@site_option
def archive(days: float, target: Path | None, site: str | None) -> None:
    """Move old jobs, with their runs, metrics, events, checkpoints and sweeps, into an archive ledger."""
    import time

    from hpctrain.cli.common import open_site
    from hpctrain.ledger.archive import archive as move

    _, led, _ = open_site(site)
    with led:
        target = target or led.path.with_name(f"{led.path.stem}-archive.db")
        done = move(led, target, time.time() - days * 86400)
    click.echo(
        visible(
            f"moved {done.jobs} jobs ({done.rows} rows) that ended over {days:g} days ago into {done.target}; "
            "`hpctrain ledger vacuum` gives the space back to the disk"
        )
    )


@ledger.command()
@site_option
def vacuum(site: str | None) -> None:
    """Rebuild the ledger file without its free space (run it when no job is being submitted or watched)."""
    from hpctrain.cli.common import open_site
    from hpctrain.ledger.archive import vacuum as rebuild

    _, led, _ = open_site(site)
    with led:
        before, after = rebuild(led)
    click.echo(visible(f"{led.path}: {before / 2**20:,.1f} MiB -> {after / 2**20:,.1f} MiB"))
