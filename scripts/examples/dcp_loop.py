"""A plain torchrun-style loop checkpointed with torch.distributed.checkpoint (DCP), preemption-safe with
hpctrain's guard: hpctrain handles the notice and the requeue around a checkpoint format that is not its own.

    python dcp_loop.py CKPT_DIR [--steps 200] [--every 50] [--step-s 0] [--progress FILE]

Every rank joins a gloo process group from the launcher's variables (`hpctrain launch`, torchrun; none:
one process) and trains a small DDP model on batches that depend only on the step and the rank. Every
``--every`` steps, and on the notice at the step every rank agrees on (`should_stop` is collective), the
ranks save model and optimizer with DCP into a temporary folder that rank 0 then renames to
``step-N``: a run killed mid-save leaves no half checkpoint. The next run resumes from the newest
``step-N``. The final weights go to CKPT_DIR/final.pt. Under a job spec's `[hang]` the guard also times
each step: a rank silent past ``step_s`` (stuck, or stopped) has its stacks written and the step restarts.
``--step-s`` and ``--progress`` only slow the steps down and record them, to watch a preemption happen.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from hpctrain.runtime import PreemptionGuard

from _watch import arguments, record


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def all_steps(ckpt_dir: Path) -> list[tuple[int, Path]]:
    return [(int(m[1]), p) for p in ckpt_dir.glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name))]


def newest(ckpt_dir: Path) -> tuple[int, Path | None]:
    return max(all_steps(ckpt_dir), default=(0, None))


def save(model: torch.nn.Module, optim: torch.optim.Optimizer, ckpt_dir: Path, step: int, keep: int = 2) -> None:
    """Every rank writes its part into a temporary folder; rank 0 then renames it and keeps the newest ``keep``."""
    tmp = ckpt_dir / f".tmp-step-{step}"
    model_sd, optim_sd = get_state_dict(model, optim)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    if dist.is_initialized():
        dist.barrier()
    if not dist.is_initialized() or dist.get_rank() == 0:
        os.replace(tmp, ckpt_dir / f"step-{step}")
        for _, old in sorted(all_steps(ckpt_dir))[:-keep]:
            shutil.rmtree(old)
    if dist.is_initialized():
        dist.barrier()


def main() -> int:
    parser = arguments(__doc__, "ckpt_dir")
    parser.add_argument("--every", type=int, default=50, help="save every this many steps")
    args = parser.parse_args()
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    if dist.is_initialized():
        model = DistributedDataParallel(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    step, found = newest(args.ckpt_dir)
    if found is not None:
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(found))
        set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    guard = PreemptionGuard()
    while step < args.steps:
        x, y = batch(step, rank)
        torch.nn.functional.mse_loss(model(x), y).backward()
        optim.step()
        optim.zero_grad()
        step += 1
        if rank == 0:
            record(args.progress, step)
        time.sleep(args.step_s)
        stop = guard.should_stop()
        if stop or step % args.every == 0:
            save(model, optim, args.ckpt_dir, step)
        if stop:
            print(f"stopped on the notice at step {step}: saved step-{step}", flush=True)
            return 0
    guard.finish()  # what follows the loop is not a step (with [hang]); a notice then stops nothing
    if rank == 0:
        weights = model.module.state_dict() if dist.is_initialized() else model.state_dict()
        torch.save(weights, args.ckpt_dir / "final.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
