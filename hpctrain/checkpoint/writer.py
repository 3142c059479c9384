"""One rank's part of a save: pick what it owns, write its chunks durably."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from hpctrain.checkpoint.format import (
    Box,
    TensorMeta,
    array_spec,
    as_numpy,
    box_slices,
    checksum,
    chunk_key,
    chunk_runs,
    contiguous_chunks,
    dtype_name,
    is_tensor,
    numpy_dtype,
    to_storage,
    ts_context,
    ts_message,
)
from hpctrain.checkpoint.naming import TENSORS
from hpctrain.checkpoint.tree import Shard
from hpctrain.errors import CheckpointError
from hpctrain.files import fsync_dir

_MAX_CHUNK = 128 << 20  # full tensors above this are stored as row blocks: written in parallel, read in part
_WRITE_STREAMS = 4  # chunk files written at a time (see write_pieces)
_WRITE_BLOCK = 8 << 20  # bytes written to a chunk file at a time (see _write_chunk)


@dataclass(frozen=True)
class Piece:
    """What this rank writes of tensor ``name``: ``data`` (tensor or array) at ``offset``, whole chunks."""

    name: str
    meta: TensorMeta
    offset: tuple[int, ...]
    data: Any

    @property
    def box(self) -> Box:
        return self.offset, tuple(self.data.shape)


def plan(leaves: dict[str, Any], writes_replicated: bool) -> list[Piece]:
    """The pieces this rank writes: its shards with ``write=True``, its full tensors if ``writes_replicated``."""
    pieces = []
    for name, leaf in leaves.items():
        if isinstance(leaf, Shard):
            if leaf.write:
                pieces.append(_shard_piece(name, leaf))
        elif is_tensor(leaf) and writes_replicated:
            shape = tuple(leaf.shape)
            meta = TensorMeta(shape, dtype_name(leaf), _full_chunks(shape, numpy_dtype(dtype_name(leaf)).itemsize))
            pieces.append(Piece(name, meta, (0,) * len(shape), leaf))
    return pieces


def _full_chunks(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    chunks = [max(1, s) for s in shape]
    if shape and math.prod(chunks) * itemsize > _MAX_CHUNK:
        chunks[0] = max(1, _MAX_CHUNK // (math.prod(chunks[1:]) * itemsize))
    return tuple(chunks)


def _shard_piece(name: str, shard: Shard) -> Piece:
    shape, offset, global_shape = tuple(shard.data.shape), tuple(shard.offset), tuple(shard.global_shape)
    chunks = tuple(shard.chunks or tuple(max(1, s) for s in shape))
    meta = TensorMeta(global_shape, dtype_name(shard.data), chunks)
    numpy_dtype(meta.dtype)
    if not (len(shape) == len(offset) == len(global_shape) == len(chunks)):
        raise CheckpointError(
            f"shard of {name!r}: shape {shape}, offset {offset}, global shape {global_shape} "
            f"and chunks {chunks} differ in rank"
        )
    index = tuple(o // c for o, c in zip(offset, chunks))
    if any(o % c for o, c in zip(offset, chunks)) or meta.chunk_box(index) != (offset, shape):
        raise CheckpointError(
            f"shard of {name!r} at offset {offset} with shape {shape} is not one cell of a "
            f"regular grid of {chunks} over {global_shape} (pass chunks= on smaller edge shards)"
        )
    return Piece(name, meta, offset, shard.data)


def write_pieces(root: Path, pieces: list[Piece]) -> dict[str, dict[str, Any]]:
    """Write ``pieces`` under checkpoint directory ``root``, durably; returns the fragment's tensor records.

    tensorstore writes every array's zarr metadata (the rank holding its first chunk does). Pieces whose
    chunks are contiguous runs of their data (``format.contiguous_chunks``) are written straight from it
    into their chunk files, a few at a time, keeping little of them in the page cache (see ``_write_chunk``;
    tensorstore's file writes keep it all, and write a temp file, rename it and fsync the directory for each
    chunk); their checksums are computed by the writing threads. tensorstore writes the other pieces, checksummed
    meanwhile on this thread. All writes are issued before any is awaited.
    """
    arrays = [(p, as_numpy(p.data)) for p in pieces]
    direct = [a.flags.c_contiguous and contiguous_chunks(p.meta, p.box) for p, a in arrays]
    opened = [
        None
        if d and any(p.offset)
        else ts.open(
            array_spec(root / TENSORS / p.name, p.meta),
            context=ts_context(),
            open_mode=ts.OpenMode(open=True, assume_metadata=True) if any(p.offset) else ts.OpenMode(create=True),
        )
        for (p, _), d in zip(arrays, direct)
    ]
    records: dict[str, dict[str, Any]] = {}
    written = []
    pool = ThreadPoolExecutor(_WRITE_STREAMS, thread_name_prefix="hpctrain-ckpt-write")
    try:
        pending = [_start(root, p, a, d, store, pool) for (p, a), d, store in zip(arrays, direct, opened)]
        for (p, a), (chunk_writes, other_writes) in zip(arrays, pending):
            indices = list(p.meta.chunks_in(p.box)) if a.size else []
            with _naming(p, root):
                # tensorstore's pieces are checksummed here while it writes them
                crcs = (
                    [future.result() for future in chunk_writes]
                    if chunk_writes
                    else [checksum(a[box_slices(p.meta.chunk_box(i), p.offset)]) for i in indices]
                )
                for future in other_writes:
                    future.result()
            record = records.setdefault(p.name, {**p.meta.to_json(), "chunks_written": []})
            record["chunks_written"] += [{"index": list(i), "crc32c": c} for i, c in zip(indices, crcs)]
            written += [root / TENSORS / p.name / chunk_key(i) for i in indices]
    finally:
        pool.shutdown(cancel_futures=True)
    _fsync_tree(root, written)
    return records


def _start(
    root: Path, piece: Piece, a: np.ndarray, direct: bool, store: Any, pool: ThreadPoolExecutor
) -> tuple[list[Any], list[Any]]:
    """Issue the piece's writes: (direct chunk writes, whose results are the chunks' checksums, in chunk
    order; the other futures, tensorstore's, the metadata's included)."""
    if direct:
        array_dir = root / TENSORS / piece.name
        size = piece.meta.chunk_file_bytes
        chunks = [
            pool.submit(_write_chunk, array_dir / chunk_key(i), run, size)
            for i, run in (chunk_runs(piece.meta, piece.box, a) if a.size else [])
        ]
        return chunks, [store] if store is not None else []
    if not a.size:
        return [], [store]
    with _naming(piece, root):
        region = store.result()[box_slices(piece.box)]
        return [], [region.write(to_storage(a), can_reference_source_data_indefinitely=True)]


def _write_chunk(path: Path, data: memoryview, size: int) -> int:
    """Write a chunk file as zarr stores it, durably: ``data``, padded to ``size`` bytes with the fill value
    (zero bytes for every dtype, as is the hole that extending the file leaves). Returns the data's checksum.

    The page cache keeps little of the file: block by block, writeback starts and what is on disk
    already is dropped, so new blocks reuse those pages. Fresh memory for a whole checkpoint's pages can
    cost more than the disk writes (reclaimed from other caches, or faulted in from a VM's host).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        done = 0
        while done < len(data):
            done += os.write(fd, data[done : done + _WRITE_BLOCK])
            os.posix_fadvise(fd, 0, done, os.POSIX_FADV_DONTNEED)  # on Linux this starts writeback too
        if size > done:
            os.ftruncate(fd, size)
        crc = checksum(data)  # while writeback runs
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return crc


@contextmanager
def _naming(piece: Piece, root: Path) -> Iterator[None]:
    """Turn tensorstore's errors into a CheckpointError naming the tensor."""
    try:
        yield
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"writing tensor {piece.name!r} into {root}: {ts_message(exc)}") from exc


def _fsync_tree(root: Path, files: list[Path]) -> None:
    """fsync every directory between ``root`` and ``files``, once each: the files are fsynced, and tensorstore
    fsyncs the parent directories of its own, but not the directories it created above them."""
    dirs = {root}
    for f in files:  # each under root: climb to a directory already listed (a set lookup, not a path comparison)
        d = f.parent
        while d not in dirs:
            dirs.add(d)
            d = d.parent
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(fsync_dir, (d for d in dirs if d.is_dir())))
