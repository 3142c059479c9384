"""Text every machine has, as the reference trainer's token shards: byte-level sequences, no tokenizer, no download.

The default text is the Python standard library's own source (``*.py`` under ``sysconfig``'s stdlib path),
which ships with every Python. Files are read in the order of their paths relative to their root, joined
by a blank line, and cut into sequences of ``seq_len + 1`` byte values (the trainer's inputs and labels);
the same files give the same shards and index, byte for byte.
"""

from __future__ import annotations

import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path

from hpctrain.errors import DataError

SEPARATOR = b"\n\n"
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
        found += sorted(
            (
                p
                for p in root.rglob("*")
                if p.suffix in suffixes and p.is_file() and not set(p.relative_to(root).parts) & SKIPPED
            ),
            key=lambda p: p.relative_to(root).as_posix(),
        )
    if not found:
        raise DataError(f"no {'/'.join(suffixes)} files under {', '.join(map(str, roots))}")
    return found


def text_stream(files: Iterable[Path], max_bytes: int) -> bytes:
    """The files' bytes joined by a blank line, at most ``max_bytes`` (files with a NUL byte are not text)."""
    out = bytearray()
    for path in files:
        data = path.read_bytes()
        if b"\0" in data:
            continue
        out += data + SEPARATOR
        if len(out) >= max_bytes:
            break
    return bytes(out[:max_bytes])


def sequences(text: bytes, seq_len: int) -> Iterator[bytes]:
    """Consecutive, non-overlapping pieces of ``seq_len + 1`` bytes (the remainder is dropped)."""
    size = seq_len + 1
    for start in range(0, len(text) - size + 1, size):
        yield text[start : start + size]


def pack_text(out_dir: Path, roots: Iterable[Path], seq_len: int, max_bytes: int, shard_bytes: int):
    """Pack the text under ``roots`` (default: the standard library) as int64 token sequences; the index."""
    import numpy as np

    from hpctrain.data.packing import pack

    text = text_stream(text_files(list(roots) or [stdlib_dir()]), max_bytes)
    samples = (
        {"__key__": f"{i:09d}", "npy": np.frombuffer(seq, dtype=np.uint8).astype(np.int64)}
        for i, seq in enumerate(sequences(text, seq_len))
    )
    return pack(samples, out_dir, shard_bytes=shard_bytes)
