"""`hpctrain examples [DIR]`: the example specs and scripts, for an install without the repository."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("dest", metavar="[DIR]", default=".", type=click.Path(file_okay=False, path_type=Path))
def examples(dest: Path) -> None:
    """Copy the example job and sweep specs and training scripts into DIR/scripts/examples (DIR: default here),
    where the README's commands and the specs' own relative paths expect them; files already there are kept."""
    from hpctrain.bundled import EXAMPLES, data_dir
    from hpctrain.errors import HpctrainError
    from hpctrain.files import copy_new

    try:
        written, kept = copy_new(data_dir(EXAMPLES), dest, EXAMPLES)
    except OSError as exc:
        raise HpctrainError(f"{exc.filename or dest}: {exc.strerror}") from None
    folder = dest / EXAMPLES
    click.echo(f"{folder}: {len(written)} file(s) written" + (f", {len(kept)} already there (kept)" if kept else ""))
    click.echo(
        f"run them from {dest}: hpctrain submit scripts/examples/gpt-tiny.toml, "
        "hpctrain sweep start scripts/examples/sweep-quadratic.toml"
    )
