"""The `hpctrain` command line: a thin layer over the Python API.

Only click is imported at start-up. Command groups of other parts live next to their code
(e.g. `hpctrain/checkpoint/cli.py`) and are imported only when named or listed; those modules
import click alone at the top, so `--help`, `submit` and `status` never load torch.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from hpctrain import __version__
from hpctrain.errors import HpctrainError

if TYPE_CHECKING:
    from rich.console import Console

site_option = click.option(
    "--site", "-s", metavar="NAME|PATH", default=None,
    help="site config: a name in site_configs/ (or $HPCTRAIN_SITE_DIR) or a file; default $HPCTRAIN_SITE or 'dev'",
)


# name -> "module:attribute" of a click command or group, imported on first use.
LAZY_COMMANDS: dict[str, str] = {
    "submit": "hpctrain.jobs_cli:submit",
    "status": "hpctrain.jobs_cli:status",
    "show": "hpctrain.jobs_cli:show",
    "cancel": "hpctrain.jobs_cli:cancel",
    "reconcile": "hpctrain.jobs_cli:reconcile",
    "rerun": "hpctrain.jobs_cli:rerun",
    "metrics": "hpctrain.observe_cli:metrics",
    "cost": "hpctrain.observe_cli:cost",
    "launch": "hpctrain.launch.cli:launch",
    "data": "hpctrain.data.cli:data",
    "ckpt": "hpctrain.checkpoint.cli:ckpt",
    "attempt": "hpctrain.runtime.cli:attempt",
    "sweep": "hpctrain.sweep.cli:sweep",
    "report": "hpctrain.report.cli:report",
}


# top-level module -> the extra (setup.cfg) that installs it: login-node installs leave these out
EXTRA_OF = {**dict.fromkeys(("numpy", "tensorstore", "crc32c", "ml_dtypes", "zarr"), "ckpt"),
            **dict.fromkeys(("torch", "deepspeed", "webdataset", "safetensors", "submitit"), "train"),
            "optuna": "sweep", "matplotlib": "report"}


class _Group(click.Group):
    """Loads LAZY_COMMANDS on demand; prints user errors (bad config, Slurm down, ...) as one line each."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS and name not in self.commands:
            import importlib

            module, attr = LAZY_COMMANDS[name].split(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except HpctrainError as exc:
            for line in str(exc).splitlines():
                click.echo(f"hpctrain: error: {line}", err=True)
            ctx.exit(2)
        except ModuleNotFoundError as exc:
            extra = EXTRA_OF.get((exc.name or "").partition(".")[0])
            if extra is None:
                raise
            click.echo(f"hpctrain: error: `hpctrain {ctx.invoked_subcommand}` needs {exc.name}, which this install "
                       f"lacks: pip install 'hpctrain[{extra}]'", err=True)
            ctx.exit(2)
        except OSError as exc:  # a file or directory hpctrain must write (logs, job directory) refused, say
            click.echo(f"hpctrain: error: {exc}", err=True)
            ctx.exit(2)
        except Exception as exc:
            import sqlite3  # only here: the CLI starts without it

            if not isinstance(exc, sqlite3.DatabaseError):
                raise
            # Damage inside the ledger file shows only when a query reaches it; the file is left as it is.
            click.echo(f"hpctrain: error: the ledger is damaged ({exc}); restore it from a copy", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="hpctrain")
def cli() -> None:
    """Train large models on Slurm GPU clusters."""


@cli.command()
def version() -> None:
    """Print hpctrain's version."""
    click.echo(f"hpctrain {__version__}")


@cli.command()
@site_option
@click.option("--json", "as_json", is_flag=True, help="print the checks as JSON")
@click.option("--nccl", is_flag=True, help="also run a short job checking interfaces, HCAs and an all-reduce")
@click.option("--partition", "-p", default=None, help="partition for --nccl (default: the site's)")
@click.option("--nodes", "-N", default=2, show_default=True, help="nodes for --nccl")
def doctor(site: str | None, as_json: bool, nccl: bool, partition: str | None, nodes: int) -> None:
    """Check a site config against the live cluster (controller, partitions, GPUs, accounts, QOS, preemption, ledger)."""
    from hpctrain.config import load_site
    from hpctrain.doctor import Doctor, network_checks

    cfg = load_site(site)
    doc = Doctor(cfg)
    checks = doc.run()
    if nccl:
        checks += network_checks(cfg, doc.client, partition or cfg.defaults.partition, nodes)
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


def make_console() -> "Console":
    """A rich console; wide when output is not a terminal, so piped tables are not squeezed to 80 columns."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)


def main() -> None:
    cli(prog_name="hpctrain")


if __name__ == "__main__":
    main()
