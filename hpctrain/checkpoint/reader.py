"""Read checkpoints back, bit-exact, verifying every chunk read against the manifest's CRC32C."""

from __future__ import annotations

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
    array_spec,
    as_numpy,
    box_slices,
    checksum,
    chunk_key,
    chunk_runs,
    contiguous_chunks,
    dtype_name,
    empty,
    is_host,
    is_tensor,
    numpy_dtype,
    to_storage,
    to_torch,
    ts_context,
    ts_message,
)
from hpctrain.checkpoint.manifest import Manifest, TensorEntry
from hpctrain.checkpoint.naming import TENSORS
from hpctrain.checkpoint.tree import Shard, flatten, leaf_nodes, plain_values, unflatten
from hpctrain.errors import CheckpointError

_VERIFY_BATCH = 512 << 20  # bytes read at once by verify()
# Chunk files read at a time: page faults of new memory and copies from the page cache spread over
# cores (each thread checksums what it read), and a parallel file system sees several requests.
_READ_STREAMS = 4


@dataclass(frozen=True)
class _Request:
    entry: TensorEntry
    box: Box
    out: np.ndarray | None = None  # read into this array (same shape and dtype) instead of a new one


def _array_dir(m: Manifest, entry: TensorEntry) -> Path:
    return m.path / TENSORS / entry.name


@contextmanager
def _naming(m: Manifest, entry: TensorEntry) -> Iterator[None]:
    """Turn tensorstore's errors into a CheckpointError naming the checkpoint and the tensor."""
    try:
        yield
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"{m.path}: tensor {entry.name!r}: {ts_message(exc)}") from exc


def check_files(m: Manifest, entry: TensorEntry, box: Box | None = None) -> None:
    """Cheap check that the chunk files under ``box`` (default: all) exist with the right size."""
    indices = entry.chunks if box is None else entry.meta.chunks_in(box)
    array_dir = _array_dir(m, entry)
    for index in indices:
        path = array_dir / chunk_key(index)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"{m.path}: tensor {entry.name!r} chunk {chunk_key(index)}: file missing") from None
        if size != entry.meta.chunk_file_bytes:
            raise CheckpointError(
                f"{m.path}: tensor {entry.name!r} chunk {chunk_key(index)}: {size} bytes, "
                f"expected {entry.meta.chunk_file_bytes} (truncated or overwritten)"
            )


def read_boxes(m: Manifest, requests: list[_Request], *, torch_memory: bool = False) -> Iterator[np.ndarray]:
    """Each request's box of its tensor, in order, each as soon as its chunks are read whole and checked
    against their CRC32C, the reads of the later ones going on meanwhile (so that the caller can copy
    one to a GPU while the next is read).

    New arrays are allocated by torch with ``torch_memory`` (see ``format.empty``). Chunks that are
    contiguous runs of their target are read from their files straight into it, in order (see
    ``format.contiguous_chunks``): tensorstore would read each into a new buffer of its own and copy it
    over, paying twice the copies and page faults. The rest go through tensorstore, all issued before any
    is awaited.
    """
    targets, direct = [], []
    for r in requests:
        check_files(m, r.entry, r.box)
        aligned = r.entry.meta.aligned_box(r.box)
        if r.out is not None and aligned == r.box and r.out.flags.c_contiguous:
            target = r.out
        else:
            target = empty(aligned[1], numpy_dtype(r.entry.meta.dtype), torch_memory=torch_memory)
        targets.append((aligned, target))
        direct.append(contiguous_chunks(r.entry.meta, aligned))
    stores = {
        r.entry.name: ts.open(array_spec(_array_dir(m, r.entry), r.entry.meta), open=True, context=ts_context())
        for r, (_, target), d in zip(requests, targets, direct)
        if target.size and not d
    }
    pool = ThreadPoolExecutor(_READ_STREAMS, thread_name_prefix="hpctrain-ckpt-read")
    try:
        # per request: {chunk index: its direct read, whose result is its checksum} or {None: tensorstore's read}
        reads: list[dict[Any, Any]] = []
        for r, (aligned, target), d in zip(requests, targets, direct):
            if not target.size:
                reads.append({})
            elif d:
                reads.append(
                    {
                        index: pool.submit(_read_chunk, m, r.entry, index, run)
                        for index, run in chunk_runs(r.entry.meta, aligned, target)
                    }
                )
            else:
                with _naming(m, r.entry):
                    source = stores[r.entry.name].result()[box_slices(aligned)]
                    reads.append({None: ts.array(to_storage(target), copy=False, write=True).write(source)})
        for r, (aligned, target), read in zip(requests, targets, reads):
            yield _finish(m, r, aligned, target, read)
    finally:
        pool.shutdown(cancel_futures=True)


def _read_chunk(m: Manifest, entry: TensorEntry, index: tuple[int, ...], out: memoryview) -> int:
    """Fill ``out`` from the start of the chunk's file; returns its checksum."""
    try:
        with open(_array_dir(m, entry) / chunk_key(index), "rb", buffering=0) as fh:
            # doubles the kernel's readahead window: more of the file in flight at once, which a virtual
            # disk needed to reach its rate (fio does this by default, fadvise_hint=1)
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            done = 0
            while done < len(out):  # a read returns at most about 2 GiB
                n = fh.readinto(out[done:])
                if not n:
                    raise OSError("file shorter than its records say (changed while being read)")
                done += n
    except OSError as exc:
        raise CheckpointError(f"{m.path}: tensor {entry.name!r} chunk {chunk_key(index)}: {exc}") from exc
    return checksum(out)  # while the bytes are fresh in the cache, on this thread


def _finish(m: Manifest, r: _Request, aligned: Box, target: np.ndarray, reads: dict[Any, Any]) -> np.ndarray:
    """Wait for the request's reads, verify its chunks and return its box (in ``r.out`` if given)."""
    with _naming(m, r.entry):
        crcs = {index: read.result() for index, read in reads.items()}
    for index in r.entry.meta.chunks_in(r.box):
        crc = crcs[index] if index in crcs else checksum(target[box_slices(r.entry.meta.chunk_box(index), aligned[0])])
        if crc != r.entry.chunks[index].crc32c:
            raise CheckpointError(
                f"{m.path}: tensor {r.entry.name!r} chunk {chunk_key(index)}: checksum mismatch (data corrupt)"
            )
    if target is r.out:
        return target
    if r.out is not None:
        np.copyto(r.out, target[box_slices(r.box, aligned[0])])
        return r.out
    return target if aligned == r.box else target[box_slices(r.box, aligned[0])].copy()


def _convert(a: np.ndarray, to: str) -> Any:
    if to not in ("torch", "numpy"):
        raise ValueError(f"to must be 'torch' or 'numpy', not {to!r}")
    return to_torch(a) if to == "torch" else a


def load(ckpt: str | Path, like: Any = None, *, rank: int = 0, to: str = "torch") -> Any:
    """The state saved in ``ckpt``, every chunk read verified.

    Without ``like``: the tree that ``rank`` saved, each shard as that rank wrote it, as torch
    tensors (or numpy arrays with ``to="numpy"``). With ``like``: a tree of the caller's layout, its
    tensors and Shards filled in place (full tensors read whole, Shards their slice of the global
    tensor, so the layout may differ from the saved one); values come from ``rank``'s saved tree.
    """
    m = Manifest.read(Path(ckpt))
    if like is None:
        skeleton = m.rank_state(rank)["tree"]
        nodes = [n for n in leaf_nodes(skeleton).values() if n["leaf"] != "value"]
        requests = [_Request(m.tensor(n["path"]), _node_box(m, n)) for n in nodes]
        arrays = dict(zip((n["path"] for n in nodes), read_boxes(m, requests, torch_memory=to == "torch")))
        return unflatten(skeleton, lambda n: n["value"] if n["leaf"] == "value" else _convert(arrays[n["path"]], to))
    leaves, skeleton = flatten(like)
    saved = leaf_nodes(m.ranks[rank]["tree"]) if rank in m.ranks else {}
    targets = {path: leaf for path, leaf in leaves.items() if isinstance(leaf, Shard) or is_tensor(leaf)}
    requests = [_target_request(m, path, leaf) for path, leaf in targets.items()]
    for leaf, request, array in zip(targets.values(), requests, read_boxes(m, requests)):
        if request.out is None:  # an accelerator tensor: copy from the host
            (leaf.data if isinstance(leaf, Shard) else leaf).copy_(to_torch(array))

    def value(node: dict[str, Any]) -> Any:
        if node["leaf"] != "value":
            return leaves[node["path"]]
        old = saved.get(node["path"], {})
        return old["value"] if old.get("leaf") == "value" else node["value"]

    return unflatten(skeleton, value)


def _node_box(m: Manifest, node: dict[str, Any]) -> Box:
    if node["leaf"] == "shard":
        return tuple(node["offset"]), tuple(node["shape"])
    shape = m.tensor(node["path"]).meta.shape
    return (0,) * len(shape), shape


def _target_request(m: Manifest, path: str, leaf: Any) -> _Request:
    entry = m.tensor(path)
    data, box = (leaf.data, leaf.box) if isinstance(leaf, Shard) else (leaf, ((0,) * leaf.ndim, tuple(leaf.shape)))
    global_shape = tuple(leaf.global_shape) if isinstance(leaf, Shard) else box[1]
    if (global_shape, dtype_name(data)) != (entry.meta.shape, entry.meta.dtype):
        raise CheckpointError(
            f"{m.path}: tensor {path!r} is {entry.meta.dtype} {list(entry.meta.shape)}, "
            f"the target is {dtype_name(data)} {list(global_shape)}"
        )
    return _Request(entry, box, as_numpy(data) if is_host(data) else None)


def load_flat(ckpt: str | Path, names: list[str] | None = None, *, to: str = "torch") -> dict[str, Any]:
    """Full tensors by name (all of them by default), assembled from every rank's chunks and verified."""
    m = Manifest.read(Path(ckpt))
    entries = [m.tensor(n) for n in (names if names is not None else m.tensors)]
    requests = [_Request(e, ((0,) * len(e.meta.shape), e.meta.shape)) for e in entries]
    return {e.name: _convert(a, to) for e, a in zip(entries, read_boxes(m, requests, torch_memory=to == "torch"))}


def read_slabs(m: Manifest, name: str) -> Iterator[np.ndarray]:
    """Tensor ``name`` in C order, in consecutive slabs of one row of whole chunks each, every chunk verified: a
    tensor streamed in the memory of one slab (the whole tensor where its chunks span its first dimension)."""
    meta = m.tensor(name).meta
    if not meta.shape or 0 in meta.shape:
        yield from read_boxes(m, [_Request(m.tensor(name), ((0,) * len(meta.shape), meta.shape))])
        return
    for start in range(0, meta.shape[0], meta.chunks[0]):
        rows = min(meta.chunks[0], meta.shape[0] - start)
        box = ((start, *(0,) * (len(meta.shape) - 1)), (rows, *meta.shape[1:]))
        yield from read_boxes(m, [_Request(m.tensor(name), box)])


def load_values(ckpt: str | Path, rank: int = 0) -> dict[str, Any]:
    """The plain (non-tensor) values of the tree ``rank`` saved, by '/'-joined path (``step``, ``meta/lr``)."""
    return plain_values(Manifest.read(Path(ckpt)).rank_state(rank)["tree"])


def quick_check(ckpt: Path) -> Manifest:
    """The manifest, once it parses and every chunk file it lists exists with the right size."""
    m = Manifest.read(ckpt)
    for entry in m.tensors.values():
        check_files(m, entry)
    return m


def verify(ckpt: str | Path) -> Manifest:
    """Read every chunk of ``ckpt`` and check it against its CRC32C; raises CheckpointError on the first fault."""
    m = quick_check(Path(ckpt))
    batch: list[_Request] = []
    size = 0
    for entry in m.tensors.values():
        for index in entry.chunks:
            batch.append(_Request(entry, entry.meta.chunk_box(index)))
            size += entry.meta.chunk_file_bytes
            if size >= _VERIFY_BATCH:
                _drain(read_boxes(m, batch))
                batch, size = [], 0
    _drain(read_boxes(m, batch))
    return m


def _drain(arrays: Iterator[np.ndarray]) -> None:
    for _ in arrays:
        pass
