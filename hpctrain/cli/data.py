"""`hpctrain data`: pack shards, verify them. Imports only click at load: `hpctrain --help` loads this module."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from hpctrain.cli.output import visible
from hpctrain.cli.types import whole


@click.group()
def data() -> None:
    """Pack WebDataset shards, index existing ones, and check shards against their index."""


@data.command()
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--shard-size", default="256M", show_default=True, help="target size of a shard, e.g. 64M or 1G")
@click.option("--prefix", default="shard", show_default=True, help="shard file names: PREFIX-000000.tar, ...")
def pack(src: Path, out: Path, shard_size: str, prefix: str) -> None:
    """Pack the .npy files under SRC into shards in OUT.

    Each file becomes one sample, stored byte for byte; OUT/index.json lists the shards.
    """
    from hpctrain.config.types import parse_memory
    from hpctrain.data.packing import pack_npy_dir

    try:
        shard_bytes = parse_memory(shard_size) * 2**20
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shard-size") from None
    index = pack_npy_dir(src, out, shard_bytes=shard_bytes, prefix=prefix)
    size = sum(s.bytes for s in index.shards)
    click.echo(
        f"packed {index.total_samples} samples into {len(index.shards)} shards ({size / 2**20:.1f} MiB): {index.path}"
    )


@data.command()
@click.argument("index", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--jobs", "-j", default=4, show_default=True, type=whole(1), help="shards checked at once")
def verify(index: Path, jobs: int) -> None:
    """Check the shards of INDEX against it.

    Size, tar headers, sample count and sha256: one line per bad shard, exit status 1 if any.
    """
    from hpctrain.data.index import load_index
    from hpctrain.data.verify import verify_index

    shards = load_index(index)
    problems = verify_index(shards, jobs=jobs)
    for line in problems:
        click.echo(visible(line))
    click.echo(f"{len(shards.shards) - len(problems)} of {len(shards.shards)} shards ok")
    sys.exit(1 if problems else 0)


@data.command("index")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("locations", nargs=-1, required=True)
@click.option("--jobs", "-j", default=4, show_default=True, type=whole(1), help="shards read at once")
def index_shards(out: Path, locations: tuple[str, ...], jobs: int) -> None:
    """Write the index OUT for existing tar shards, in the order given.

    Each LOCATION is a tar file in OUT's directory, `pipe:COMMAND` (the command writes the tar to stdout)
    or an http(s):// URL, read once for its sample count, size and sha256. Shards are named by their file names.
    """
    from hpctrain.data.verify import index_shards as write_index

    index = write_index(out, locations, jobs=jobs)
    click.echo(
        f"indexed {index.total_samples} samples in {len(index.shards)} shards "
        f"({sum(s.bytes for s in index.shards) / 2**20:.1f} MiB): {index.path}"
    )


@data.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--src",
    "roots",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="a directory of .py files (repeatable; default: this Python's standard library)",
)
@click.option("--seq-len", default=64, show_default=True, type=whole(1))
@click.option("--max-size", default="8M", show_default=True, help="text to take at most, e.g. 8M")
@click.option("--shard-size", default="16M", show_default=True, help="target size of a shard")
@click.option(
    "--held-out",
    default="0",
    show_default=True,
    help="also pack this much text from files never trained on into OUT/held-out (an [eval] index), e.g. 1M",
)
def text(out: Path, roots: tuple[Path, ...], seq_len: int, max_size: str, shard_size: str, held_out: str) -> None:
    """Pack source text (default: the standard library's, which every Python has) into OUT as byte-level
    token sequences for the reference GPT trainer (vocab 256); the same files give the same shards."""
    from hpctrain.config.types import parse_memory
    from hpctrain.data.text import pack_text

    sizes = {"--held-out": 0}
    for name, value in (("--max-size", max_size), ("--shard-size", shard_size), ("--held-out", held_out)):
        if name == "--held-out" and value.strip() == "0":
            continue
        try:
            sizes[name] = parse_memory(value) * 2**20
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=name) from None
    index, held = pack_text(out, roots, seq_len, sizes["--max-size"], sizes["--shard-size"], sizes["--held-out"])
    for what, written in (("", index), ("held out ", held)):
        if written is not None:
            click.echo(
                f"wrote {what}{written.total_samples} sequences of {seq_len + 1} bytes in {len(written.shards)} "
                f"shards: {written.path}"
            )


@data.command()
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--samples", "count", default=4096, show_default=True, type=whole(1))
@click.option("--seq-len", default=64, show_default=True, type=whole(2))
@click.option("--vocab", default=256, show_default=True, type=whole(2))
@click.option("--seed", default=0, show_default=True, type=whole(0, 2**32 - 1))
@click.option("--shard-size", default="16M", show_default=True, help="target size of a shard")
def synth(out: Path, count: int, seq_len: int, vocab: int, seed: int, shard_size: str) -> None:
    """Write a synthetic token dataset (learnable sequences) for the reference GPT trainer into OUT."""
    from hpctrain.config.job import Model
    from hpctrain.config.types import parse_memory
    from hpctrain.train.dataset import pack_token_dataset

    try:
        shard_bytes = parse_memory(shard_size) * 2**20
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--shard-size") from None
    index = pack_token_dataset(out, Model(seq_len=seq_len, vocab=vocab), seed, count, shard_bytes)
    click.echo(
        f"wrote {index.total_samples} sequences of {seq_len + 1} tokens in {len(index.shards)} shards: {index.path}"
    )
