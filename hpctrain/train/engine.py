"""Build the DeepSpeed pipeline engine of the reference GPT for a dp x tp x pp layout, and step it.

The step loop takes any iterator of (input_ids, labels) micro-batches for this rank's
data-parallel index (only the first and last pipeline stages read it) and calls hooks after
every step: logging, checkpointing (with ``hpctrain.train.state.local_state``) plug in there.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hpctrain.train.deepspeed_loader import deepspeed  # isort: skip (first: see the module)

import torch
import torch.distributed as dist
from deepspeed.pipe import LayerSpec, PipelineModule
from deepspeed.runtime.pipe.engine import PipelineEngine
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from hpctrain.config.job import JobSpec, Model
from hpctrain.errors import ConfigError
from hpctrain.parallel.groups import ProcessGroups, new_groups
from hpctrain.parallel.topology import Layout
from hpctrain.train.ds_config import ds_config
from hpctrain.train.model import TransformerBlock, gpt_layers, lm_loss
from hpctrain.train.optimizer import AdamW
from hpctrain.train.synthetic import Batch


@dataclass(frozen=True)
class StepResult:
    step: int
    loss: float
    step_time_s: float


StepHook = Callable[[PipelineEngine, StepResult], None]


def init_distributed() -> None:
    """torch.distributed from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK): nccl on GPU, else gloo.

    Also sets up deepspeed.comm; safe to call again, or after torch.distributed was initialised.
    """
    # DeepSpeed would otherwise JIT-compile a CPU shared-memory comm op (~50 s); gloo does not need it. Set without
    # reading deepspeed.ops.__compatible_ops__, whose first read probes every op (setuptools, a compiler: ~0.7 s a rank)
    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")


def layout_of(spec: JobSpec) -> Layout:
    return Layout(dp=spec.parallel.dp, tp=spec.parallel.tp, pp=spec.parallel.pp)


def pipeline_module(model: Model, seed: int, groups: ProcessGroups) -> PipelineModule:
    layout = groups.layout
    return PipelineModule(
        [LayerSpec(cls, **kwargs) for cls, kwargs in gpt_layers(model, seed=seed, group=groups.tp)],
        topology=PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp),
        loss_fn=lm_loss,
        partition_method=f"type:{TransformerBlock.__name__}",
    )


def build_engine(spec: JobSpec, layout: Layout | None = None) -> PipelineEngine:
    """The engine of this rank (a collective call: every rank of the job makes it)."""
    layout = layout or layout_of(spec)
    if layout != layout_of(spec):
        raise ConfigError(f"layout {layout} differs from the spec's parallel section {layout_of(spec)}")
    config = ds_config(spec)
    init_distributed()
    groups = new_groups(layout)
    module = pipeline_module(spec.model or Model(), spec.seed, groups)
    _count_replicated_once(module, groups.coord.tp)
    adamw = optimizer(module, config)  # takes the optimizer's section out of the config
    engine, *_ = deepspeed.initialize(model=module, optimizer=adamw, config=config)
    _check_grid(engine, layout)
    return engine


def optimizer(module: PipelineModule, config: dict[str, Any]) -> AdamW:
    """The AdamW DeepSpeed would make of ``config``'s optimizer section (taken out of it), as ours: torch's, without
    its import of torch._dynamo (hpctrain.train.optimizer). ZeRO checks an optimizer's exact type: ours is allowed."""
    params = {k: v for k, v in config.pop("optimizer")["params"].items() if k != "torch_adam"}
    config["zero_allow_untested_optimizer"] = True
    return AdamW(module.parameters(), **params)


def _count_replicated_once(module: PipelineModule, tp_rank: int) -> None:
    """Make DeepSpeed's fp32 gradient clipping count every replicated parameter once per pipeline stage.

    Without ZeRO it counts unmarked parameters only on the first rank of the whole pipe x tp group,
    leaving out those of later stages; marking them on TP rank 0 fixes that and leaves the ZeRO and
    bf16 norms (which count unmarked parameters on TP rank 0) as they were.
    """
    if tp_rank == 0:
        for p in module.parameters():
            if not getattr(p, "tensor_model_parallel", False):
                p.model_parallel = True


def _check_grid(engine: PipelineEngine, layout: Layout) -> None:
    """DeepSpeed's groups must be ours: the TP layers use ours, DeepSpeed reduces over its own."""
    rank, grid = dist.get_rank(), engine.grid
    theirs = (grid.slice_group, grid.dp_group, grid.pp_group)
    ours = (layout.tp_group(rank), layout.dp_group(rank), layout.pp_group(rank))
    if tuple(map(list, theirs)) != ours:
        raise RuntimeError(f"rank {rank}: DeepSpeed's tp/dp/pp groups {theirs} differ from the layout's {ours}")


def train_step(engine: PipelineEngine, batches: Iterator[Batch]) -> float:
    """One optimizer step over grad_accum micro-batches from ``batches``; the loss averaged over the step."""
    return float(engine.train_batch(batches))


def train(
    engine: PipelineEngine, batches: Iterator[Batch], steps: int, hooks: Sequence[StepHook] = ()
) -> list[StepResult]:
    """Run ``steps`` optimizer steps, calling every hook (on every rank) after each."""
    results = []
    for _ in range(steps):
        start = time.perf_counter()
        loss = train_step(engine, batches)
        result = StepResult(step=engine.global_steps, loss=loss, step_time_s=time.perf_counter() - start)
        for hook in hooks:
            hook(engine, result)
        results.append(result)
    return results
