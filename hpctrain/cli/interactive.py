"""`hpctrain notebook`: an interactive JupyterLab session in an allocation, started and waited for."""

from __future__ import annotations

import getpass
import os
import shlex
import socket
import sys
from typing import TYPE_CHECKING

import click

from hpctrain.cli.common import open_site, site_option
from hpctrain.cli.types import Finite, whole

if TYPE_CHECKING:
    from hpctrain.interactive import Started
    from hpctrain.slurm.client import SlurmClient


@click.command()
@click.option("--gpus", type=whole(0), help="GPUs on the session's node (default: the spec's, else 0)")
@click.option(
    "--time", "time_limit", metavar="T", help="time limit, e.g. 2:00:00 (default: the spec's, else the site's)"
)
@click.option("--partition", metavar="P", help="default: the spec's, else the site's choice")
@click.option("--preemptible/--no-preemptible", default=None, help="run in the site's preemptible QOS")
@click.option("--image", metavar="IMG", help="run in this container image (the site's container runtime)")
@click.option(
    "--idle-minutes",
    type=Finite(0, min_open=True),
    help="end after this long with no kernel activity (default 60)",
)
@click.option("--port", type=click.IntRange(0, 65535), help="the server's port on the node (default: a free one)")
@click.option(
    "--spec",
    "spec_path",
    type=click.Path(dir_okay=False),
    help="a job spec: its environment, setup, container, workdir and data paths",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=Finite(1),
    default=600.0,
    show_default=True,
    help="seconds to wait for the session to answer (queue time included); then it is cancelled",
)
@click.option("--open", "open_browser", is_flag=True, help="open the lab in this host's browser, where there is one")
@click.option(
    "--shell",
    is_flag=True,
    help="a shell in the allocation (srun --pty) instead of JupyterLab; the "
    "allocation is held for more shells until --idle-minutes pass without one",
)
@site_option
def notebook(
    gpus: int | None,
    time_limit: str | None,
    partition: str | None,
    preemptible: bool | None,
    image: str | None,
    idle_minutes: float | None,
    port: int | None,
    spec_path: str | None,
    timeout_s: float,
    open_browser: bool,
    shell: bool,
    site: str | None,
) -> None:
    """Start JupyterLab on a compute node and print how to reach it (or, with --shell, a shell there). The session
    ends itself after --idle-minutes without kernel activity (without a shell), at its time limit, or with
    `hpctrain cancel ID`."""
    from hpctrain.config import load_job_spec
    from hpctrain.interactive import session_spec, start

    if shell and (port is not None or open_browser):
        raise click.UsageError("--port and --open are JupyterLab's: a --shell session has no server")

    base = load_job_spec(spec_path) if spec_path else None
    spec = session_spec(
        base,
        gpus=gpus,
        time=time_limit,
        partition=partition,
        preemptible=preemptible,
        image=image,
        idle_minutes=idle_minutes,
        port=port,
        shell=shell or None,
    )
    cfg, ledger, client = open_site(site)

    def submitted(job_id: int, slurm_job_id: str) -> None:
        click.echo(
            f"submitted {spec.name}: ledger id {job_id}, slurm job {slurm_job_id}; "
            f"waiting for {'the allocation' if shell else 'JupyterLab'} (at most {timeout_s:.0f} s)"
        )

    with ledger:
        got = start(cfg, ledger, client, spec, timeout_s, spec_path or "<notebook>", submitted)
    s, p = got.session, got.placement
    if s.shell:
        run_shell(client, got)
        return
    click.echo(
        f"notebook: ledger id {got.job_id}, slurm job {got.slurm_job_id} on {s.node} "
        f"({p.partition}/{p.qos} as {p.account})"
    )
    if spec.resources.preemptible is True:  # "allowed" runs in the site's QOS unless placed by its start
        click.echo("  preemptible: it may be stopped at any time; a notice shows in your kernels first, save then")
    click.echo(f"  tunnel: {s.tunnel(socket.getfqdn(), getpass.getuser())}")
    click.echo(f"  then:   {s.url('localhost')}")
    click.echo(f"  on the cluster's network: {s.url()}")
    click.echo(
        f"  ends after {s.idle_minutes:g} min without kernel activity (or with its GPUs idle, where NVML reads "
        "them) or at its time limit; "
        f"`hpctrain cancel {got.job_id}` ends it now"
    )
    if open_browser:
        import webbrowser

        if not webbrowser.open(s.browser_page().as_uri()):  # the token stays out of the browser's command line
            click.echo("hpctrain: warning: no browser here: use the tunnel line above", err=True)


def run_shell(client: SlurmClient, got: Started) -> None:
    """Say how to start a shell in the session's allocation; start one there when this is a terminal."""
    argv = got.session.shell_command(got.slurm_job_id, os.environ.get("SHELL") or "/bin/bash")
    click.echo(f"shell: ledger id {got.job_id}, slurm job {got.slurm_job_id}: {shlex.join(argv)}")
    click.echo(
        f"  held for more shells until {got.session.idle_minutes:g} min pass without one; "
        f"`hpctrain cancel {got.job_id}` ends it now"
    )
    if sys.stdin.isatty():
        sys.stdout.flush()
        os.execvpe(client.executable(argv[0]), argv, client.env())
