"""The `hpctrain` command line: a thin layer over the Python API (the root group; commands in this package).

Only click is imported at start-up. Each command family is a module of this package (`jobs`, `placement`, `observe`,
`ckpt`, `data`, `cache`, `launch`, `attempt`, `sweep`, `report`, `doctor`, `ledger`, `examples`, `interactive`; shared options in
`common`), imported only when named or listed; those modules import click alone at the top, so `--help`, `submit` and
`status` never load torch. Commands parse arguments and print; the packages do the work.
"""

from __future__ import annotations

import click

from hpctrain import __version__
from hpctrain.errors import HpctrainError

# name -> "module:attribute" of a click command or group, imported on first use.
LAZY_COMMANDS: dict[str, str] = {
    "doctor": "hpctrain.cli.doctor:doctor",
    "submit": "hpctrain.cli.jobs:submit",
    "where": "hpctrain.cli.placement:where",
    "status": "hpctrain.cli.jobs:status",
    "show": "hpctrain.cli.jobs:show",
    "logs": "hpctrain.cli.jobs:logs",
    "cancel": "hpctrain.cli.jobs:cancel",
    "reconcile": "hpctrain.cli.jobs:reconcile",
    "rerun": "hpctrain.cli.jobs:rerun",
    "metrics": "hpctrain.cli.observe:metrics",
    "cost": "hpctrain.cli.observe:cost",
    "quota": "hpctrain.cli.observe:quota",
    "launch": "hpctrain.cli.launch:launch",
    "data": "hpctrain.cli.data:data",
    "cache": "hpctrain.cli.cache:cache",
    "ckpt": "hpctrain.cli.ckpt:ckpt",
    "attempt": "hpctrain.cli.attempt:attempt",
    "sweep": "hpctrain.cli.sweep:sweep",
    "report": "hpctrain.cli.report:report",
    "compare": "hpctrain.cli.compare:compare",
    "eval": "hpctrain.cli.evaluate:evaluate",
    "sample": "hpctrain.cli.sample:sample",
    "model": "hpctrain.cli.model:model",
    "export": "hpctrain.cli.export:export",
    "ledger": "hpctrain.cli.ledger:ledger",
    "examples": "hpctrain.cli.examples:examples",
    "notebook": "hpctrain.cli.interactive:notebook",
}


# top-level module -> the extra (setup.cfg) that installs it: login-node installs leave these out
EXTRA_OF = {
    **dict.fromkeys(("numpy", "tensorstore", "crc32c", "ml_dtypes", "zarr"), "ckpt"),
    **dict.fromkeys(("torch", "deepspeed", "webdataset", "safetensors", "submitit"), "train"),
    "optuna": "sweep",
    "matplotlib": "report",
    "mlflow": "mlflow",
    "tensorboard": "tensorboard",
}
# extra -> the oldest Python it installs on, where newer than hpctrain's own 3.10 (setup.cfg): tensorstore has no
# release for 3.10 from 0.1.79 on
EXTRA_PYTHON = dict.fromkeys(("ckpt", "train", "all"), (3, 11))


def install_hint(extras: list[str]) -> str:
    """The pip command that installs ``extras``, and the Python they need where this one is too old."""
    import sys

    hint = f"pip install 'hpctrain[{','.join(extras)}]'"
    need = max((EXTRA_PYTHON.get(e, (3, 10)) for e in extras), default=(3, 10))
    if sys.version_info < need:
        hint += f" (on Python {need[0]}.{need[1]} or newer: this is {sys.version_info[0]}.{sys.version_info[1]})"
    return hint


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

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for arg in args:  # bytes that are not UTF-8 (lone surrogates): no file, ledger or terminal takes them
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                click.echo(f"hpctrain: error: argument {ascii(arg)[:80]} is not UTF-8 text", err=True)
                ctx.exit(2)
            if "\0" in arg:  # never from a command line; from a caller in Python (no path or program takes one)
                click.echo(f"hpctrain: error: argument {ascii(arg)[:80]} holds a NUL byte", err=True)
                ctx.exit(2)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except HpctrainError as exc:
            from hpctrain.cli.output import visible

            for line in str(exc).splitlines():
                click.echo(f"hpctrain: error: {visible(line)}", err=True)
            ctx.exit(2)
        except ModuleNotFoundError as exc:
            from hpctrain.cli.common import MissingModules

            names = exc.names if isinstance(exc, MissingModules) else [exc.name or ""]
            extras = [EXTRA_OF[top] for name in names if (top := name.partition(".")[0]) in EXTRA_OF]
            if len(extras) < len(names):
                raise
            click.echo(
                f"hpctrain: error: `hpctrain {ctx.invoked_subcommand}` needs {' and '.join(names)}, which this "
                f"install lacks: {install_hint(sorted(set(extras)))}",
                err=True,
            )
            ctx.exit(2)
        except OSError as exc:  # a file or directory hpctrain must write (logs, job directory) refused, say
            click.echo(f"hpctrain: error: {exc}", err=True)
            ctx.exit(2)
        except Exception as exc:
            import sqlite3  # only here: the CLI starts without it

            if not isinstance(exc, sqlite3.DatabaseError):
                raise
            from hpctrain.ledger.failures import describe

            # Damage inside the ledger file shows only when a query reaches it; the file is left as it is.
            click.echo(f"hpctrain: error: {describe(exc)}", err=True)
            ctx.exit(2)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="hpctrain")
def cli() -> None:
    """Train large models on Slurm GPU clusters."""


@cli.command()
def version() -> None:
    """Print hpctrain's version."""
    click.echo(f"hpctrain {__version__}")


def main() -> None:
    cli(prog_name="hpctrain")


if __name__ == "__main__":
    main()
