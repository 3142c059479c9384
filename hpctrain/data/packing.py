"""Writing samples into WebDataset tar shards (webdataset's ShardWriter) and their index."""

from __future__ import annotations

import hashlib
import itertools
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import webdataset as wds

from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.errors import DataError

DEFAULT_SHARD_BYTES = 256 * 2**20
INDEX_NAME = "index.json"


class _HashingFile:
    """A shard being written: hashed and counted on the way, so the index needs no second read."""

    def __init__(self, path: str):
        self._fh = open(path, "wb")
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        self.samples = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.bytes += len(data)
        return self._fh.write(data)

    def close(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()


def pack(
    samples: Iterable[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    prefix: str = "shard",
) -> ShardIndex:
    """Write ``samples`` (webdataset dicts: "__key__" plus one entry per extension, e.g. "npy": array
    or bytes) to ``out_dir/<prefix>-NNNNNN.tar`` shards of about ``shard_bytes`` each, and the index."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples = iter(samples)
    first = next(samples, None)
    if first is None:
        raise DataError(f"{out}: nothing to pack (no samples)")
    files: dict[str, _HashingFile] = {}

    def opener(name: str) -> _HashingFile:
        files[name] = _HashingFile(name)
        return files[name]

    # ShardWriter closes only files it opened itself; `post` runs once a shard is complete.
    with wds.ShardWriter(
        str(out / f"{prefix}-%06d.tar"),
        maxsize=shard_bytes,
        opener=opener,
        post=lambda name: files[name].close(),
        verbose=0,
        mtime=0,
    ) as writer:
        previous = None
        for sample in itertools.chain([first], samples):
            previous = _check_key(sample, previous)
            writer.write(sample)
            files[writer.fname].samples += 1
    index = ShardIndex(
        out / INDEX_NAME,
        tuple(ShardInfo(Path(name).name, f.samples, f.bytes, f.sha256.hexdigest()) for name, f in files.items()),
    )
    index.write()
    return index


def _check_key(sample: Mapping[str, Any], previous: str | None) -> str:
    """Keys become tar member names "<key>.<ext>": readers split at the first dot and merge equal neighbours."""
    key = sample.get("__key__")
    if not isinstance(key, str) or not key or "." in key.rsplit("/", 1)[-1] or key == previous:
        raise DataError(
            f"sample key {key!r}: expected a non-empty string without '.' in its last path "
            f"part, different from the previous sample's"
        )
    return key


def npy_samples(src_dir: str | Path) -> Iterator[dict[str, Any]]:
    """Every ``*.npy`` under ``src_dir`` (sorted), as {"__key__": relative path without .npy, "npy": file bytes}."""
    src = Path(src_dir)
    if not src.is_dir():
        raise DataError(f"{src}: not a directory")
    paths = sorted(src.rglob("*.npy"))
    if not paths:
        raise DataError(f"{src}: no .npy files to pack")
    for path in paths:
        yield {"__key__": path.relative_to(src).with_suffix("").as_posix(), "npy": path.read_bytes()}


def pack_npy_dir(
    src_dir: str | Path, out_dir: str | Path, *, shard_bytes: int = DEFAULT_SHARD_BYTES, prefix: str = "shard"
) -> ShardIndex:
    """Pack a directory of ``.npy`` files, stored byte for byte (no re-encoding)."""
    return pack(npy_samples(src_dir), out_dir, shard_bytes=shard_bytes, prefix=prefix)
