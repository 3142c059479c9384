"""`hpctrain ckpt ...`: list, verify, inspect and export checkpoints.

Only click is imported at the top: `hpctrain --help` imports this module and must not load torch,
numpy or tensorstore. Each command imports what it needs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click

from hpctrain.cli.output import json_text, make_console, styled, visible

_path = click.Path(exists=True, file_okay=False, path_type=Path)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _problem(problem: str | None, ckpt: Path) -> Any:
    """A checkpoint's problem for a table row, in red: without its path, which the row shows already."""
    return "ok" if problem is None else styled((problem.replace(str(ckpt), "").lstrip("/: "), "red"))


def _print_table(title: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left")
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*(cell if isinstance(cell, Text) else str(cell) for cell in row))
    make_console(min_width=120).print(table)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def ckpt() -> None:
    """List, verify, inspect and export checkpoints."""


@ckpt.command("ls")
@click.argument("directory", type=_path)
def ls(directory: Path) -> None:
    """List the checkpoints in DIRECTORY, newest first, with a quick check of each (and their evaluation jobs'
    outcomes from the ledger, where it has any, and the model versions that pin them)."""
    from hpctrain.checkpoint.naming import list_dirs
    from hpctrain.checkpoint.pins import pins
    from hpctrain.checkpoint.resume import statuses

    found = list(statuses(directory))
    evaluated = _evaluations([s.dir.path for s in found])
    pinned = {s.dir.path: ", ".join(pins(s.dir.path)) for s in found}
    any_pinned = any(pinned.values())
    rows = []
    for s in found:
        m = s.manifest
        rows.append(
            (
                s.dir.step,
                s.dir.path.name,
                _problem(s.problem, s.dir.path),
                _size(m.stored_bytes) if m else "",
                len(m.tensors) if m else "",
                m.data["world_size"] if m else "",
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(m.data["created"])) if m else "",
                json.dumps(m.data.get("metrics") or {}) if m else "",
                *([evaluated.get(s.dir.path, "")] if evaluated else []),
                *([pinned[s.dir.path]] if any_pinned else []),
            )
        )
    columns: tuple[str, ...] = ("step", "name", "state", "size", "tensors", "ranks", "created", "metrics")
    columns += ("evaluations",) * bool(evaluated) + ("pinned by",) * any_pinned
    _print_table(f"checkpoints in {directory}", columns, rows)
    unfinished = list_dirs(directory, kind="tmp") + list_dirs(directory, kind="trash")
    if unfinished:
        click.echo(
            f"{len(unfinished)} unfinished or abandoned save/delete director(ies): "
            + ", ".join(d.path.name for d in unfinished)
        )


def _evaluations(paths: list[Path]) -> dict[Path, str]:
    """Each checkpoint's evaluation jobs' outcomes (`hpctrain eval`) in this user's ledger, where there is one to
    read: a compute node, or a machine without a site config or ledger, lists none."""
    from hpctrain.config import load_site
    from hpctrain.errors import HpctrainError
    from hpctrain.ledger import Ledger
    from hpctrain.ledger.evaluations import outcome

    try:
        cfg = load_site(None)
        if not Path(cfg.ledger.path).exists():
            return {}
        found = {}
        with Ledger(cfg.ledger.path, mode=cfg.ledger.mode) as ledger:
            for path in paths:
                names = dict.fromkeys((str(path), str(path.absolute()), str(path.resolve())))
                rows = [e for name in names for e in ledger.evaluations.of_checkpoint(name)]
                if rows:
                    found[path] = "; ".join(f"{e['evaluator']}: {outcome(e)}" for e in rows)
        return found
    except HpctrainError:
        return {}


@ckpt.command()
@click.argument("path", type=_path)
def verify(path: Path) -> None:
    """Read every chunk of checkpoint PATH (or of every checkpoint in directory PATH) against its checksum."""
    from hpctrain.checkpoint.manifest import NewerFormatError
    from hpctrain.checkpoint.naming import MANIFEST, parse
    from hpctrain.checkpoint.reader import verify as verify_one
    from hpctrain.checkpoint.resume import record_corrupt, statuses
    from hpctrain.errors import CheckpointError
    from hpctrain.ledger.journal import Journal

    journal = Journal.from_env()
    named = parse(path)
    if named and named.kind != "committed":  # a manifest in it does not make it one: the rename does
        what = "an unfinished save" if named.kind == "tmp" else "a checkpoint being deleted"
        raise CheckpointError(f"{path}: {what} of step {named.step}, not a checkpoint (resume never reads it)")
    if (path / MANIFEST).exists() or named:
        try:
            m = verify_one(path)
        except NewerFormatError:  # not corrupt: nothing to journal
            raise
        except CheckpointError as exc:
            record_corrupt(path, getattr(named, "step", -1), str(exc), journal)
            raise
        chunks = sum(len(e.chunks) for e in m.tensors.values())
        click.echo(
            f"ok: {path} (step {m.step}): {len(m.tensors)} tensors, {chunks} chunks, {_size(m.stored_bytes)} verified"
        )
        return
    found = list(statuses(path, full=True))
    for s in found:
        if s.problem and not s.newer:
            record_corrupt(s.dir.path, s.dir.step, s.problem, journal)
    _print_table(
        f"verify {path}",
        ("step", "name", "result"),
        [(s.dir.step, s.dir.path.name, _problem(s.problem, s.dir.path)) for s in found],
    )
    bad = [s for s in found if s.problem]
    if bad:
        raise CheckpointError(f"{len(bad)} of {len(found)} checkpoints in {path} failed verification")
    if not found:
        raise CheckpointError(f"{path}: no checkpoints (step_<N> directories) found")


@ckpt.command()
@click.argument("path", type=_path)
@click.option("--json", "as_json", is_flag=True, help="print the whole manifest as JSON")
def inspect(path: Path, as_json: bool) -> None:
    """Show checkpoint PATH: step, layout, lineage, cursors and its tensors."""
    from hpctrain.checkpoint.manifest import Manifest

    m = Manifest.read(path)
    if as_json:
        click.echo(json_text(m.data, indent=2))
        return
    d = m.data
    click.echo(
        f"{path}: step {m.step}, {d['world_size']} rank(s), attempt {d['attempt']}, "
        f"created {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(d['created']))}, "
        f"{_size(m.stored_bytes)}"
    )
    for key in ("layout", "lineage", "metrics"):
        click.echo(f"{key}: {json.dumps(d.get(key) or {})}")
    for rank, info in sorted(m.ranks.items()):
        click.echo(visible(f"rank {rank} on {info.get('host')}: cursor {json.dumps(info.get('cursor'))}"))
    rows = [
        (
            e.name,
            e.meta.dtype,
            list(e.meta.shape),
            list(e.meta.chunks),
            len(e.chunks),
            ",".join(map(str, sorted({c.rank for c in e.chunks.values()}))),
            _size(e.meta.chunk_file_bytes * len(e.chunks)),
        )
        for e in m.tensors.values()
    ]
    _print_table("tensors", ("name", "dtype", "shape", "chunks", "#chunks", "written by rank", "stored"), rows)


@ckpt.command()
@click.argument("path", type=_path)
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["torch", "safetensors"]), default="torch", show_default=True)
def export(path: Path, out: Path, fmt: str) -> None:
    """Write every tensor of checkpoint PATH, whole, to one file OUT, with the plain values of rank 0's tree (step,
    hyperparameters, ...): torch, {name: tensor or value}; safetensors, the values as JSON in the "values" metadata."""
    from hpctrain.checkpoint.manifest import Manifest
    from hpctrain.checkpoint.reader import load_flat, load_values

    step = Manifest.read(path).step
    tensors, values = load_flat(path), load_values(path)
    if fmt == "torch":
        import torch

        torch.save({**tensors, **values}, out)
    else:
        from safetensors.torch import save_file

        save_file(tensors, out, metadata={"step": str(step), "source": str(path), "values": json.dumps(values)})
    click.echo(f"exported {len(tensors)} tensors and {len(values)} values of step {step} to {out} ({fmt})")
