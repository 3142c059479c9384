"""The array format: zarr v3 written by tensorstore, dtypes, chunk geometry, numpy/torch at the edges.

The core works on numpy arrays; torch is touched only when the caller hands in torch tensors (then it
is already imported) or asks for torch tensors back.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import crc32c
import ml_dtypes
import numpy as np
import tensorstore as ts

from hpctrain.errors import CheckpointError

_NATIVE = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
# zarr-python 3.1 cannot read these: stored as unsigned ints of the same width, real dtype in the attributes.
_STORED_AS_UINT = ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offset, shape)


def numpy_dtype(name: str) -> np.dtype:
    if name in _NATIVE:
        return np.dtype(name)
    if name in _STORED_AS_UINT:
        return np.dtype(getattr(ml_dtypes, name))
    raise CheckpointError(f"unsupported tensor dtype {name!r} (supported: {', '.join(_NATIVE + _STORED_AS_UINT)})")


def storage_dtype(name: str) -> np.dtype:
    dtype = numpy_dtype(name)
    return np.dtype(f"uint{8 * dtype.itemsize}") if name in _STORED_AS_UINT else dtype


@dataclass(frozen=True)
class TensorMeta:
    """A stored tensor: global shape, logical dtype and the chunk shape (one writer per chunk)."""

    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorMeta:
        return cls(tuple(d["shape"]), d["dtype"], tuple(d["chunks"]))

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "chunks": list(self.chunks)}

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-s // c) for s, c in zip(self.shape, self.chunks))

    @property
    def chunk_file_bytes(self) -> int:
        """Size of every chunk file: edge chunks are stored padded to the full chunk shape."""
        return math.prod(self.chunks) * storage_dtype(self.dtype).itemsize

    def chunk_box(self, index: tuple[int, ...]) -> Box:
        """The part of the tensor that chunk ``index`` holds (edge chunks are clipped)."""
        lo = tuple(i * c for i, c in zip(index, self.chunks))
        return lo, tuple(min(c, s - o) for c, s, o in zip(self.chunks, self.shape, lo))

    def chunks_in(self, box: Box) -> Iterator[tuple[int, ...]]:
        """Indices of the chunks that overlap ``box``."""
        offset, shape = box
        ranges = [range(o // c, -(-(o + n) // c)) for o, n, c in zip(offset, shape, self.chunks)]
        return itertools.product(*ranges)

    def aligned_box(self, box: Box) -> Box:
        """The smallest union of whole chunks that covers ``box``."""
        offset, shape = box
        lo = tuple(o // c * c for o, c in zip(offset, self.chunks))
        hi = tuple(min(-(-(o + n) // c) * c, s) for o, n, c, s in zip(offset, shape, self.chunks, self.shape))
        return lo, tuple(high - low for high, low in zip(hi, lo))


def checksum(a: np.ndarray | memoryview) -> int:
    """CRC32C of the array's bytes in C order (hardware-accelerated; releases the GIL, so threads share it)."""
    return crc32c.crc32c(a if isinstance(a, memoryview) else np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)


def chunk_key(index: tuple[int, ...]) -> str:
    """The chunk's file under the array directory (zarr v3 default chunk key encoding)."""
    return "/".join(["c", *map(str, index)])


def contiguous_chunks(meta: TensorMeta, box: Box) -> bool:
    """Whether every chunk in ``box`` (whole chunks) is a contiguous run of the box in C order and, as stored
    (zarr's bytes codec: C order, little-endian), a prefix of its chunk file: the chunks span the box in all
    but the first dimension."""
    return sys.byteorder == "little" and tuple(box[1][1:]) == meta.chunks[1:]


def chunk_runs(meta: TensorMeta, box: Box, array: np.ndarray) -> Iterator[tuple[tuple[int, ...], memoryview]]:
    """(chunk index, the bytes of ``array`` it holds) for each chunk in ``box``: a ``contiguous_chunks`` box,
    non-empty, that the C-contiguous ``array`` holds."""
    flat = array.reshape(-1).view(np.uint8).data
    row = array.nbytes // array.shape[0] if array.ndim else array.nbytes
    for index in meta.chunks_in(box):
        offset, shape = meta.chunk_box(index)
        start = (offset[0] - box[0][0]) * row if array.ndim else 0
        yield index, flat[start : start + math.prod(shape) * array.itemsize]


def box_slices(box: Box, origin: tuple[int, ...] | None = None) -> tuple[slice, ...]:
    offset, shape = box
    origin = origin or (0,) * len(offset)
    return tuple(slice(o - b, o - b + n) for o, n, b in zip(offset, shape, origin))


def array_spec(path: Path, meta: TensorMeta) -> dict[str, Any]:
    stored = storage_dtype(meta.dtype)
    return {
        "driver": "zarr3",
        "kvstore": {"driver": "file", "path": str(path)},
        # Without this, tensorstore skips chunks equal to the fill value and they look deleted.
        "store_data_equal_to_fill_value": True,
        "metadata": {
            "shape": list(meta.shape),
            "data_type": stored.name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(meta.chunks)}},
            "chunk_key_encoding": {"name": "default"},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
            "fill_value": False if stored == np.bool_ else 0,
            "attributes": {"hpctrain": {"dtype": meta.dtype}},
        },
    }


@cache
def ts_context() -> ts.Context:
    """One tensorstore context per process: shared I/O thread pools, durable (fsynced) file writes."""
    return ts.Context({"file_io_sync": True})


def ts_message(exc: BaseException) -> str:
    """tensorstore's error on one line, without the spec it appends."""
    return str(exc).split(" [tensorstore_spec=")[0].replace("\n", " ")


def _torch() -> Any:
    return sys.modules.get("torch")


def is_tensor(x: Any) -> bool:
    torch = _torch()
    return isinstance(x, np.ndarray) or (torch is not None and isinstance(x, torch.Tensor))


def dtype_name(x: Any) -> str:
    return x.dtype.name if isinstance(x, np.ndarray) else str(x.dtype).removeprefix("torch.")


def is_host(x: Any) -> bool:
    return isinstance(x, np.ndarray) or x.device.type == "cpu"


def as_numpy(x: Any) -> np.ndarray:
    """A numpy view of a host tensor or array; tensors on an accelerator are copied to the host."""
    if isinstance(x, np.ndarray):
        return x
    name = dtype_name(x)
    numpy_dtype(name)
    t = x.detach() if is_host(x) else x.detach().cpu()
    if name in _STORED_AS_UINT:
        torch = _torch()
        return t.view({1: torch.uint8, 2: torch.int16}[t.element_size()]).numpy().view(numpy_dtype(name))
    return t.numpy()


def to_storage(a: np.ndarray) -> np.ndarray:
    return a.view(storage_dtype(a.dtype.name))


def empty(shape: tuple[int, ...], dtype: np.dtype, *, torch_memory: bool = False) -> np.ndarray:
    """An uninitialised array, with ``torch_memory`` in memory from torch's allocator (for ``to_torch``).

    numpy advises huge pages for big arrays; faulting those in can stall on memory compaction for
    seconds, which torch's plain pages do not.
    """
    if not torch_memory:
        return np.empty(shape, dtype)
    import torch

    raw = torch.empty(math.prod(shape) * dtype.itemsize, dtype=torch.uint8).numpy()
    return raw.view(dtype).reshape(shape)


def to_torch(a: np.ndarray) -> Any:
    """A torch tensor sharing ``a``'s memory (bf16 and fp8 go through an integer view)."""
    import torch

    if a.dtype.name in _STORED_AS_UINT:
        return torch.from_numpy(a.view(np.dtype(f"int{8 * a.itemsize}"))).view(getattr(torch, a.dtype.name))
    return torch.from_numpy(a)
