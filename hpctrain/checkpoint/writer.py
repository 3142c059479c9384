"""One rank's part of a save: pick what it owns, snapshot it to host buffers, write its chunks durably."""

from __future__ import annotations

import math
import os
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import tensorstore as ts

from hpctrain.checkpoint.format import (Box, TensorMeta, array_spec, as_numpy, box_slices, checksum, chunk_key,
                                        dtype_name, empty, is_host, is_tensor, numpy_dtype, to_storage, ts_context,
                                        ts_message)
from hpctrain.checkpoint.naming import TENSORS
from hpctrain.checkpoint.tree import Shard
from hpctrain.errors import CheckpointError
from hpctrain.ledger.journal import fsync_dir

_COPY_BLOCK = 64 << 20  # bytes per copy task: big enough to amortise, small enough to spread over threads
_MAX_CHUNK = 128 << 20  # full tensors above this are stored as row blocks: written in parallel, read in part


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
        raise CheckpointError(f"shard of {name!r}: shape {shape}, offset {offset}, global shape {global_shape} "
                              f"and chunks {chunks} differ in rank")
    index = tuple(o // c for o, c in zip(offset, chunks))
    if any(o % c for o, c in zip(offset, chunks)) or meta.chunk_box(index) != (offset, shape):
        raise CheckpointError(f"shard of {name!r} at offset {offset} with shape {shape} is not one cell of a "
                              f"regular grid of {chunks} over {global_shape} (pass chunks= on smaller edge shards)")
    return Piece(name, meta, offset, shard.data)


class HostBuffers:
    """Host copies of the pieces of an async save, reused from save to save (fresh memory costs page faults)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, tuple[int, ...]], Any] = {}
        self._pool = ThreadPoolExecutor(max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="hpctrain-ckpt-copy")

    def snapshot(self, pieces: list[Piece]) -> list[Piece]:
        """Copies of ``pieces`` that the caller may not change; returns once every copy is done."""
        old, self._buffers = self._buffers, {}  # buffers of tensors no longer saved are let go
        copies, jobs, devices = [], [], False
        for p in pieces:
            if is_host(p.data):
                buf = self._buffer(old, p, lambda: empty(tuple(p.data.shape), numpy_dtype(p.meta.dtype),
                                                         torch_memory=not isinstance(p.data, np.ndarray)))
                jobs += _blocks(buf, as_numpy(p.data))
            else:  # accelerator -> pinned host memory, asynchronously; synchronised below
                import torch

                buf = self._buffer(old, p, lambda: torch.empty(p.data.shape, dtype=p.data.dtype, pin_memory=True))
                buf.copy_(p.data.detach(), non_blocking=True)
                devices = True
            copies.append(replace(p, data=buf))
        list(self._pool.map(lambda job: np.copyto(*job), jobs))
        if devices:
            import torch

            torch.cuda.synchronize()
        return copies

    def _buffer(self, old: dict[tuple[str, tuple[int, ...]], Any], p: Piece, make: Any) -> Any:
        key = (p.name, p.offset)
        buf = old.get(key)
        if buf is None or tuple(buf.shape) != tuple(p.data.shape) or dtype_name(buf) != p.meta.dtype:
            buf = make()
        self._buffers[key] = buf
        return buf

    def close(self) -> None:
        self._pool.shutdown()
        self._buffers.clear()


def _blocks(dst: np.ndarray, src: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(dst, src) pairs that together copy ``src`` into ``dst``, split so that threads can share the work."""
    if not src.flags.c_contiguous or src.nbytes <= _COPY_BLOCK:
        return [(dst, src)]
    d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    return [(d[i:i + _COPY_BLOCK], s[i:i + _COPY_BLOCK]) for i in range(0, s.size, _COPY_BLOCK)]


def write_pieces(root: Path, pieces: list[Piece]) -> dict[str, dict[str, Any]]:
    """Write ``pieces`` under checkpoint directory ``root``, durably; returns the fragment's tensor records.

    The rank holding a tensor's first chunk writes its zarr metadata; the others write only their chunks.
    All opens and writes are issued before any is awaited.
    """
    arrays = [(p, as_numpy(p.data)) for p in pieces]
    opened = [ts.open(array_spec(root / TENSORS / p.name, p.meta), context=ts_context(),
                      **({"open": True, "assume_metadata": True} if any(p.offset) else {"create": True}))
              for p, _ in arrays]
    records: dict[str, dict[str, Any]] = {}
    writes = []
    for (p, a), store in zip(arrays, opened):
        records.setdefault(p.name, {**p.meta.to_json(), "chunks_written": []})
        with _naming(p, root):
            region = store.result()[box_slices(p.box)]
            writes.append(region.write(to_storage(a), can_reference_source_data_indefinitely=True) if a.size else None)
    written = []
    for (p, a), write in zip(arrays, writes):
        if write is None:
            continue
        indices = list(p.meta.chunks_in(p.box))
        crcs = [checksum(a[box_slices(p.meta.chunk_box(i), p.offset)]) for i in indices]  # while tensorstore writes
        with _naming(p, root):
            write.result()
        records[p.name]["chunks_written"] += [{"index": list(i), "crc32c": c} for i, c in zip(indices, crcs)]
        written += [root / TENSORS / p.name / chunk_key(i) for i in indices]
    _fsync_tree(root, written)
    return records


@contextmanager
def _naming(piece: Piece, root: Path) -> Iterator[None]:
    """Turn tensorstore's errors into a CheckpointError naming the tensor."""
    try:
        yield
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"writing tensor {piece.name!r} into {root}: {ts_message(exc)}") from exc


def _fsync_tree(root: Path, files: list[Path]) -> None:
    """fsync every directory between ``root`` and ``files``: tensorstore fsyncs each file and its parent
    directory, but not the directories it created above them."""
    dirs = {root}
    for f in files:
        dirs.update(d for d in f.parents if d.is_relative_to(root))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(fsync_dir, (d for d in dirs if d.is_dir())))
