"""`hpctrain launch` command (imports only click at module load)."""

from __future__ import annotations

import click

from hpctrain.cli.common import site_option
from hpctrain.cli.types import Counts


@click.command(context_settings={"ignore_unknown_options": True})
@site_option
@click.option("--dry-run", is_flag=True, help="print the environment and the srun command; start nothing")
@click.option(
    "--srun-option",
    "srun_options",
    multiple=True,
    metavar="OPT",
    help="one more srun option, e.g. --container-image=IMAGE (pyxis)",
)
@click.option("--inside", metavar="CMD", default="", help="run each task under CMD, e.g. 'apptainer exec IMAGE'")
@click.option(
    "--python",
    metavar="PATH",
    default=None,
    help="the Python that runs hpctrain's task shim (default: this one; in a container, the image's)",
)
@click.option(
    "--nodes",
    "-N",
    type=Counts(),
    default="",
    help="run on this many of the allocation's nodes: healthy ones, not those Slurm took out of it (--no-kill) "
    "or whose ranks failed first in retry.exclude_node_after steps (2); the rest are spares. Several, e.g. 4,2 (a "
    "job's shapes): the largest those nodes hold (default: every node, no check)",
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def launch(
    site: str | None,
    dry_run: bool,
    srun_options: tuple[str, ...],
    inside: str,
    python: str | None,
    nodes: tuple[int, ...],
    command: tuple[str, ...],
) -> None:
    """Start COMMAND once per task of this allocation with torch.distributed's rendezvous set.

    Use inside a batch script: hpctrain launch -- python train.py --lr 3e-4
    """
    import shlex
    import sys

    from hpctrain.config import load_site
    from hpctrain.launch.launcher import launch as run_launch

    run_launch(
        load_site(site),
        list(command),
        dry_run=dry_run,
        python=python or sys.executable,
        srun_options=srun_options,
        inside=shlex.split(inside),
        nodes=nodes,
    )
