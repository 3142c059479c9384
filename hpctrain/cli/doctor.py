"""`hpctrain doctor`: check a site config against the live cluster."""

from __future__ import annotations

import sys

import click

from hpctrain.cli.common import make_console, site_option
from hpctrain.cli.output import json_text, styled
from hpctrain.cli.types import whole


@click.command()
@site_option
@click.option("--json", "as_json", is_flag=True, help="print the checks as JSON")
@click.option("--nccl", is_flag=True, help="also run a short job checking interfaces, HCAs and an all-reduce")
@click.option("--partition", "-p", default=None, help="partition for --nccl (default: the site's)")
@click.option("--nodes", "-N", type=whole(1), default=2, show_default=True, help="nodes for --nccl")
@click.option(
    "--ledger",
    "ledger_only",
    is_flag=True,
    help="only the ledger: probe its file system from two hosts where it is not a local disk",
)
@click.option(
    "--host",
    default=None,
    metavar="HOST",
    help="the probe's second host: a login host reached by ssh (implies --ledger; default: a job on a compute node)",
)
def doctor(
    site: str | None, as_json: bool, nccl: bool, partition: str | None, nodes: int, ledger_only: bool, host: str | None
) -> None:
    """Check a site config against the live cluster (controller, partitions, GPUs, accounts, QOS, preemption, ledger)."""
    from hpctrain.config import load_site
    from hpctrain.doctor.cluster import Doctor

    cfg = load_site(site)
    doc = Doctor(cfg)
    checks = doc.ledger_checks(host) if ledger_only or host is not None else doc.run()
    if nccl:
        from hpctrain.doctor.network import network_checks
        from hpctrain.ledger import Ledger

        with Ledger(cfg.ledger.path, mode=cfg.ledger.mode) as ledger:
            checks += network_checks(cfg, ledger, doc.client, partition or cfg.defaults.partition, nodes)
    failed = [c for c in checks if c.verdict == "FAIL"]
    if as_json:
        click.echo(json_text([c.__dict__ for c in checks], indent=2))
    else:
        from rich.table import Table

        colour = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}
        table = Table(title=f"hpctrain doctor: site {cfg.name}", title_justify="left")
        for col in ("check", "verdict", "detail"):
            table.add_column(col, overflow="fold")
        for c in checks:
            table.add_row(c.name, styled((c.verdict, colour[c.verdict])), c.detail)
        console = make_console()
        console.print(table)
        if failed:
            console.print(f"doctor: {len(failed)} of {len(checks)} checks failed", style="bold red")
        else:
            console.print(f"doctor: site {cfg.name!r} is ready ({len(checks)} checks)", style="green")
    sys.exit(1 if failed else 0)
