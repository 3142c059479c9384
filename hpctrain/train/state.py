"""This rank's training state as named tensors, where each lies in the global state, and the way back.

Keys are the global names (the same on every rank that holds a piece):
  model.<param>                  fp32 weights (the fp32 master copy under bf16 or ZeRO-1)
  optim.exp_avg.<param>, optim.exp_avg_sq.<param>   AdamW moments, shaped like the weight
  optim.step                     AdamW's step count (one for all parameters)
  engine.global_steps, engine.global_samples
<param> is the PipelineModule's parameter name, e.g. ``3.qkv.weight`` for layer 3; a pipeline
stage holds only its own layers' entries. TP-split weights are slices of the global tensor (see
``placements``); under ZeRO-1 the moments and master weights, partitioned over data-parallel
ranks, are assembled with DeepSpeed's tensor-fragment API, so every data-parallel rank returns the
full TP slice. Both ``local_state`` and ``load_local_state`` are collective over the data-parallel
group. Restoring into an engine of the same layout continues training bitwise identically.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpctrain.train.deepspeed_loader import deepspeed  # noqa: F401  # isort: skip (first: see the module)

import torch
from deepspeed.runtime.pipe.engine import PipelineEngine
from deepspeed.utils import (
    safe_get_full_fp32_param,
    safe_get_full_optimizer_state,
    safe_set_full_fp32_param,
    safe_set_full_optimizer_state,
)
from torch import nn

MOMENTS = ("exp_avg", "exp_avg_sq")
COUNTERS = ("global_steps", "global_samples")


@dataclass(frozen=True)
class Placement:
    """Where a local tensor lies in the global tensor of the same name.

    ``split_dim`` is the tensor-parallel dimension (None: replicated over TP ranks). ``writer``
    marks the one rank that should write this slice: data-parallel rank 0 (and TP rank 0 for
    replicated entries; global rank 0 for the scalars). With hpctrain.checkpoint:
    ``Shard(tensor, p.global_shape, p.offset, write=p.writer)``.
    """

    global_shape: tuple[int, ...]
    offset: tuple[int, ...]
    split_dim: int | None
    writer: bool


def _params(engine: PipelineEngine) -> dict[str, nn.Parameter]:
    return dict(engine.module.named_parameters())


def _partitioned(param: nn.Parameter) -> bool:
    """ZeRO-1 and the bf16 optimizer keep fp32 masters and moments as flat data-parallel partitions."""
    return hasattr(param, "_hp_mapping")  # None on ranks whose partition holds none of it


def _ensure_optimizer_state(engine: PipelineEngine) -> None:
    """Create AdamW's zero state (as its first step would) so a fresh engine can be captured or loaded."""
    opt = engine.basic_optimizer
    if opt.state:
        return
    saved = opt.state_dict()
    flat = [p for group in opt.param_groups for p in group["params"]]
    indices = [i for group in saved["param_groups"] for i in group["params"]]
    saved["state"] = {
        i: {"step": torch.tensor(0.0), **{k: torch.zeros_like(p) for k in MOMENTS}} for i, p in zip(indices, flat)
    }
    opt.load_state_dict(saved)  # casts and places the state the way the optimizer expects
    if hasattr(engine.optimizer, "_lazy_init_hp_params_optimizer_state"):
        # DeepSpeed links its per-parameter views of the flat state only after the first step
        engine.optimizer._lazy_init_hp_params_optimizer_state()


def _step(engine: PipelineEngine) -> torch.Tensor:
    steps = {float(s["step"]) for s in engine.basic_optimizer.state.values()}
    if len(steps) != 1:
        raise RuntimeError(f"optimizer step counts differ between parameters: {sorted(steps)}")
    return torch.tensor(steps.pop(), dtype=torch.float32)


def local_state(engine: PipelineEngine) -> dict[str, torch.Tensor]:
    """Copies of this rank's state tensors (on the CPU), by global name."""
    _ensure_optimizer_state(engine)
    state: dict[str, torch.Tensor] = {}
    for name, p in _params(engine).items():
        if _partitioned(p):
            state[f"model.{name}"] = safe_get_full_fp32_param(p)
            for key in MOMENTS:
                state[f"optim.{key}.{name}"] = safe_get_full_optimizer_state(p, key)
        else:
            state[f"model.{name}"] = p.detach().clone()
            for key in MOMENTS:
                state[f"optim.{key}.{name}"] = engine.basic_optimizer.state[p][key].detach().clone()
    state["optim.step"] = _step(engine)
    for counter in COUNTERS:
        state[f"engine.{counter}"] = torch.tensor(getattr(engine, counter), dtype=torch.int64)
    return {k: v.cpu() for k, v in state.items()}


def placements(engine: PipelineEngine) -> dict[str, Placement]:
    """How each entry of ``local_state(engine)`` maps onto its global tensor."""
    grid = engine.grid
    tp, tp_rank = grid.get_slice_parallel_world_size(), grid.get_slice_parallel_rank()
    dp_rank = grid.get_data_parallel_rank()
    where: dict[str, Placement] = {}
    for name, p in _params(engine).items():
        dim = getattr(p, "tp_split_dim", None)
        shape, offset = list(p.shape), [0] * p.dim()
        if dim is not None:
            shape[dim], offset[dim] = shape[dim] * tp, shape[dim] * tp_rank
        placed = Placement(tuple(shape), tuple(offset), dim, dp_rank == 0 and (dim is not None or tp_rank == 0))
        for key in (f"model.{name}", *(f"optim.{m}.{name}" for m in MOMENTS)):
            where[key] = placed
    scalar = Placement((), (), None, engine.global_rank == 0)
    for key in ("optim.step", *(f"engine.{c}" for c in COUNTERS)):
        where[key] = scalar
    return where


@torch.no_grad()
def load_local_state(engine: PipelineEngine, state: dict[str, torch.Tensor]) -> None:
    """Restore what ``local_state`` captured on this rank, into an engine of the same layout."""
    params = _params(engine)
    expected = set(placements(engine))
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"state does not fit this engine: missing {missing[:5]}, unexpected {extra[:5]}")
    _ensure_optimizer_state(engine)
    opt = engine.basic_optimizer
    for name, p in params.items():
        master = state[f"model.{name}"].to(p.device)
        if master.shape != p.shape:
            raise ValueError(f"model.{name}: shape {tuple(master.shape)}, this engine has {tuple(p.shape)}")
        p.copy_(master)
        if _partitioned(p):
            safe_set_full_fp32_param(p, master)
            for key in MOMENTS:
                safe_set_full_optimizer_state(p, state[f"optim.{key}.{name}"].to(p.device), key)
        else:
            for key in MOMENTS:
                opt.state[p][key].copy_(state[f"optim.{key}.{name}"])
    for s in opt.state.values():
        s["step"].copy_(state["optim.step"])
    for counter in COUNTERS:
        setattr(engine, counter, int(state[f"engine.{counter}"]))
