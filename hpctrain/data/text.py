"""Text every machine has, as the reference trainer's token shards: byte-level sequences, no tokenizer, no download.

The default text is the Python standard library's own source (``*.py`` under ``sysconfig``'s stdlib path),
which ships with every Python. Files are read in the order of their paths relative to their root, joined
by a blank line, and cut into sequences of ``seq_len + 1`` byte values (the trainer's inputs and labels);
the same files give the same shards and index, byte for byte.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from hpctrain.data.index import ShardIndex
from hpctrain.errors import DataError

SEPARATOR = b"\n\n"
HELD_OUT = "held-out"  # the held-out text's directory under the training text's
SKIPPED = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def text_files(roots: Iterable[Path], suffixes: tuple[str, ...] = (".py",)) -> list[Path]:
    """Files under ``roots`` with one of ``suffixes``, each root's sorted by relative path; installed packages,
    test suites and caches are left out (Python installs of one version differ there)."""
    found = []
    for root in roots:
        if not root.is_dir():
            raise DataError(f"{root}: not a directory")
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIPPED]  # not walked at all: site-packages can hold 50,000 files
            files += [p for p in map(Path(folder).joinpath, names) if p.suffix in suffixes and p.is_file()]
        found += sorted(files, key=lambda p: p.relative_to(root).as_posix())
    if not found:
        raise DataError(f"no {'/'.join(suffixes)} files under {', '.join(map(str, roots))}")
    return found


def read_text(files: Sequence[Path], max_bytes: int) -> tuple[bytes, int]:
    """The files' bytes joined by a blank line, at most ``max_bytes`` (files with a NUL byte are not text), and
    how many of ``files`` that read (the last one perhaps in part)."""
    out = bytearray()
    for read, path in enumerate(files, 1):
        data = path.read_bytes()
        if b"\0" not in data:
            out += data + SEPARATOR
        if len(out) >= max_bytes:
            return bytes(out[:max_bytes]), read
    return bytes(out), len(files)


def text_stream(files: Sequence[Path], max_bytes: int) -> bytes:
    """The files' bytes joined by a blank line, at most ``max_bytes``: see `read_text`."""
    return read_text(files, max_bytes)[0]


def sequences(text: bytes, seq_len: int) -> Iterator[bytes]:
    """Consecutive, non-overlapping pieces of ``seq_len + 1`` bytes (the remainder is dropped)."""
    size = seq_len + 1
    for start in range(0, len(text) - size + 1, size):
        yield text[start : start + size]


def pack_text(
    out_dir: Path, roots: Iterable[Path], seq_len: int, max_bytes: int, shard_bytes: int, held_out_bytes: int = 0
) -> tuple[ShardIndex, ShardIndex | None]:
    """Pack the text under ``roots`` (default: the standard library) as int64 token sequences; with
    ``held_out_bytes``, that much more text into ``out_dir/held-out``, from the files after the last one the
    training text read (a whole file never trained on, for an evaluation's `eval.index`). The indexes."""
    files = text_files(list(roots) or [stdlib_dir()])
    text, read = read_text(files, max_bytes)
    index = _pack_sequences(out_dir, text, seq_len, shard_bytes)
    if not held_out_bytes:
        return index, None
    held_out = text_stream(files[read:], held_out_bytes)
    if len(held_out) <= seq_len:
        raise DataError(f"no text is left after the first {max_bytes} bytes to hold out: take less (--max-size)")
    return index, _pack_sequences(out_dir / HELD_OUT, held_out, seq_len, shard_bytes)


def _pack_sequences(out_dir: Path, text: bytes, seq_len: int, shard_bytes: int) -> ShardIndex:
    import numpy as np

    from hpctrain.data.packing import pack

    samples = (
        {"__key__": f"{i:09d}", "npy": np.frombuffer(seq, dtype=np.uint8).astype(np.int64)}
        for i, seq in enumerate(sequences(text, seq_len))
    )
    return pack(samples, out_dir, shard_bytes=shard_bytes)
