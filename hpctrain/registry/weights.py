"""An export's weights file, written tensor by tensor from the checkpoint in the memory of one slab of one tensor
(see ``checkpoint.reader.read_slabs``), never the whole model: safetensors from its header (computed from the
manifest's shapes and dtypes) and then each tensor's bytes in order; torch's format by ``torch.save`` of those
bytes mapped from a safetensors file (the page cache holds them, not the process)."""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import struct
import warnings
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.format import numpy_dtype, to_torch
from hpctrain.checkpoint.manifest import Manifest
from hpctrain.errors import CheckpointError

SAFETENSORS_DTYPES = {
    "bool": "BOOL",
    "int8": "I8",
    "int16": "I16",
    "int32": "I32",
    "int64": "I64",
    "uint8": "U8",
    "uint16": "U16",
    "uint32": "U32",
    "uint64": "U64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}
_BLOCK = 1 << 20  # bytes hashed at a time


def header(m: Manifest, names: dict[str, str]) -> dict[str, Any]:
    """The safetensors header of the checkpoint's tensors ``names`` (exported name -> checkpoint name), in order."""
    found: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for out, name in names.items():
        meta = m.tensor(name).meta
        if meta.dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(f"{m.path}: tensor {name!r} is {meta.dtype}, which safetensors cannot hold")
        size = math.prod(meta.shape) * numpy_dtype(meta.dtype).itemsize
        found[out] = {
            "dtype": SAFETENSORS_DTYPES[meta.dtype],
            "shape": list(meta.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    return found


def write_safetensors(path: Path, m: Manifest, names: dict[str, str]) -> str:
    """Write the tensors ``names`` of the checkpoint ``m`` to ``path`` as safetensors, one slab at a time; returns
    the file's sha256."""
    from hpctrain.checkpoint.reader import read_slabs

    text = json.dumps(header(m, names), separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors' own writer pads it
    digest = hashlib.sha256()
    with open(path, "wb") as fh:
        for part in (struct.pack("<Q", len(text)), text):
            fh.write(part)
            digest.update(part)
        for name in names.values():
            for slab in read_slabs(m, name):
                data = slab.reshape(-1).view("uint8").data
                fh.write(data)
                digest.update(data)
    return digest.hexdigest()


def write_torch(path: Path, staged: Path) -> str:
    """Write the safetensors file ``staged`` to ``path`` in torch's format (``torch.save`` of a dict of tensors);
    returns the file's sha256."""
    import torch

    torch.save(_mapped(staged), path)
    return file_sha256(path)


def _mapped(staged: Path) -> dict[str, Any]:
    """The tensors of the safetensors file ``staged``, in its memory mapped read-only."""
    import numpy as np

    with open(staged, "rb") as fh:
        size = struct.unpack("<Q", fh.read(8))[0]
        entries = json.loads(fh.read(size))
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    dtypes = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    tensors = {}
    with warnings.catch_warnings():  # read-only memory: torch.save only reads it
        warnings.simplefilter("ignore", UserWarning)
        for name, entry in entries.items():
            if name == "__metadata__":
                continue
            begin, end = entry["data_offsets"]
            dtype = numpy_dtype(dtypes[entry["dtype"]])
            if begin == end:
                array = np.empty(entry["shape"], dtype)
            else:
                array = np.frombuffer(mapped, dtype, (end - begin) // dtype.itemsize, 8 + size + begin)
            tensors[name] = to_torch(array.reshape(entry["shape"]))
    return tensors


def file_sha256(path: Path) -> str:
    """Hashed through one buffer: a new block each read kept two alive at once (32 MiB), past a tight memory limit."""
    digest = hashlib.sha256()
    block = bytearray(_BLOCK)
    view = memoryview(block)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(block):
            digest.update(view[:n])
    return digest.hexdigest()
