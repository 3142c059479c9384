"""Small values agreed on by every rank, on whichever device the process group's backend needs."""

from __future__ import annotations

import sys
from typing import Literal


def all_reduce_int(value: int, op: Literal["max", "min"]) -> int:
    """``value`` reduced over every rank when torch.distributed is initialised (else ``value`` itself)."""
    return int(_all_reduce([value], op, float_=False)[0])


def all_reduce_floats(values: list[float], op: Literal["max", "min"]) -> list[float]:
    """Each of ``values`` reduced over every rank (float64) when torch.distributed is initialised."""
    return [float(v) for v in _all_reduce(values, op, float_=True)]


def _all_reduce(values: list[float] | list[int], op: Literal["max", "min"], float_: bool) -> list[float] | list[int]:
    """NCCL reduces only GPU tensors, on the device the rank set as current; gloo only host tensors."""
    dist = sys.modules.get("torch.distributed")  # not imported: not initialised either
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return values
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor(values, dtype=torch.float64 if float_ else torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
    return tensor.tolist()
