"""`hpctrain doctor`: check a site config against the live cluster."""

from __future__ import annotations

import json
import sys

import click

from hpctrain.cli.common import make_console, site_option


@click.command()
@site_option
@click.option("--json", "as_json", is_flag=True, help="print the checks as JSON")
@click.option("--nccl", is_flag=True, help="also run a short job checking interfaces, HCAs and an all-reduce")
@click.option("--partition", "-p", default=None, help="partition for --nccl (default: the site's)")
@click.option("--nodes", "-N", default=2, show_default=True, help="nodes for --nccl")
def doctor(site: str | None, as_json: bool, nccl: bool, partition: str | None, nodes: int) -> None:
    """Check a site config against the live cluster (controller, partitions, GPUs, accounts, QOS, preemption, ledger)."""
    from hpctrain.config import load_site
    from hpctrain.doctor.cluster import Doctor

    cfg = load_site(site)
    doc = Doctor(cfg)
    checks = doc.run()
    if nccl:
        from hpctrain.doctor.network import network_checks
        from hpctrain.ledger import Ledger

        with Ledger(cfg.ledger.path, mode=cfg.ledger.mode) as ledger:
            checks += network_checks(cfg, ledger, doc.client, partition or cfg.defaults.partition, nodes)
    failed = [c for c in checks if c.verdict == "FAIL"]
    if as_json:
        click.echo(json.dumps([c.__dict__ for c in checks], indent=2))
    else:
        from rich.table import Table

        colour = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}
        table = Table(title=f"hpctrain doctor: site {cfg.name}", title_justify="left")
        for col in ("check", "verdict", "detail"):
            table.add_column(col, overflow="fold")
        for c in checks:
            table.add_row(c.name, f"[{colour[c.verdict]}]{c.verdict}[/]", c.detail)
        console = make_console()
        console.print(table)
        if failed:
            console.print(f"[bold red]doctor: {len(failed)} of {len(checks)} checks failed[/]")
        else:
            console.print(f"[green]doctor: site {cfg.name!r} is ready ({len(checks)} checks)[/]")
    sys.exit(1 if failed else 0)
