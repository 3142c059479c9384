"""Megatron-style tensor-parallel linear layers over a given process group.

Each layer builds its FULL weight from a seeded generator on every rank and keeps only its
slice, so a TP-split model starts numerically equal to the unsplit one (cheap for small models).
A split parameter carries ``tensor_model_parallel = True`` (DeepSpeed's marker, used for the
gradient norm) and ``tp_split_dim``, the dimension it is sliced along.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02


def tp_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def tp_rank(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else dist.get_rank(group)


class _CopyToTP(torch.autograd.Function):
    """Megatron's "f": identity forward; all-reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's "g": all-reduce forward; identity backward (every TP rank computes the same loss)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dimension forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.rank, ctx.width = dist.get_rank(group), x.shape[-1]
        parts = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.narrow(-1, ctx.rank * ctx.width, ctx.width).contiguous(), None


def copy_to_tp(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if tp_size(group) == 1 else _CopyToTP.apply(x, group)


def reduce_from_tp(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if tp_size(group) == 1 else _ReduceFromTP.apply(x, group)


def gather_from_tp(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    return x if tp_size(group) == 1 else _GatherFromTP.apply(x, group)


def split_parameter(full: torch.Tensor, dim: int, group: dist.ProcessGroup | None) -> nn.Parameter:
    """This rank's contiguous slice of ``full`` along ``dim``, marked as tensor-parallel."""
    size = tp_size(group)
    if full.shape[dim] % size:
        raise ValueError(f"dimension {dim} of size {full.shape[dim]} is not divisible by tp = {size}")
    part = full.chunk(size, dim=dim)[tp_rank(group)].clone()
    param = nn.Parameter(part)
    # markers read with getattr (by DeepSpeed, and train/state.py), which Parameter does not declare
    param.tensor_model_parallel = True  # type: ignore[attr-defined]
    param.tp_split_dim = dim  # type: ignore[attr-defined]
    return param


def init_weight(out_features: int, in_features: int, generator: torch.Generator) -> torch.Tensor:
    return torch.empty(out_features, in_features).normal_(0.0, INIT_STD, generator=generator)


class ColumnParallelLinear(nn.Module):
    """y = x A^T + b with A split by output rows: each rank computes its slice of y.

    With ``gather_output`` the slices are all-gathered into the full y; otherwise y stays split
    (the input of a RowParallelLinear).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        generator: torch.Generator,
        group: dist.ProcessGroup | None = None,
        bias: bool = True,
        gather_output: bool = False,
    ):
        super().__init__()
        self.group, self.gather_output = group, gather_output
        self.weight = split_parameter(init_weight(out_features, in_features, generator), 0, group)
        self.bias = split_parameter(torch.zeros(out_features), 0, group) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(copy_to_tp(x, self.group), self.weight, self.bias)
        return gather_from_tp(y, self.group) if self.gather_output else y


class RowParallelLinear(nn.Module):
    """y = x A^T + b with A split by input columns: takes a split x, all-reduces the partial sums.

    The bias is replicated and added once, after the reduction.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        generator: torch.Generator,
        group: dist.ProcessGroup | None = None,
        bias: bool = True,
    ):
        super().__init__()
        self.group = group
        self.weight = split_parameter(init_weight(out_features, in_features, generator), 1, group)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias
