"""One small integer agreed on by every rank, on whichever device the process group's backend needs."""

from __future__ import annotations

import sys
from typing import Literal


def all_reduce_int(value: int, op: Literal["max", "min"]) -> int:
    """``value`` reduced over every rank when torch.distributed is initialised (else ``value`` itself).

    NCCL reduces only GPU tensors, on the device the rank set as current; gloo only host tensors.
    """
    dist = sys.modules.get("torch.distributed")  # not imported: not initialised either
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return value
    import torch

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    flag = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.MIN)
    return int(flag.item())
