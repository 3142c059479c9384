"""Per-rank compute time, for finding stragglers: a rank whose own work takes far longer than that of the
ranks doing the same work (its pipeline stage's), which every other rank then waits for.

Synchronous training hides a straggler: every rank's step takes as long as the slowest one's, the others
waiting in collectives. What differs is the time a rank spends computing rather than waiting: here the
forward passes of its model part, timed by module hooks (after a device synchronize where there is a
GPU, so that queued kernels count where they run). Every ``every`` steps the ranks gather their mean
compute seconds per step and rank 0 journals them (`ranks`), with each rank's node and stage; the login
side (hpctrain.jobs.stragglers) compares each rank with its stage's median.
"""

from __future__ import annotations

import time
from typing import Any

from hpctrain.contract import JobEnvironment
from hpctrain.ledger.journal import Journal


class ComputeTimer:
    """Times the forward passes of ``module`` on this rank; as a step hook on every rank, gathers them (a
    collective) every ``every`` steps."""

    def __init__(self, module: Any, stage: int, every: int = 50) -> None:
        import torch

        self.every, self.stage, self.seconds, self.steps = every, stage, 0.0, 0
        self._sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        self._started = 0.0
        module.register_forward_pre_hook(self._start)
        module.register_forward_hook(self._stop)

    def _start(self, *_: Any) -> None:
        self._sync()
        self._started = time.perf_counter()

    def _stop(self, *_: Any) -> None:
        self._sync()
        self.seconds += time.perf_counter() - self._started

    def __call__(self, engine: Any, result: Any) -> None:
        """A step hook: every ``every`` steps, gather and journal the ranks' compute times."""
        self.steps += 1
        step = result.step
        if step % self.every:
            return
        import torch.distributed as dist

        mine = {
            "rank": dist.get_rank(),
            "node": JobEnvironment().node,
            "stage": self.stage,
            "compute_s": self.seconds / self.steps,
        }
        ranks: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(ranks, mine)
        self.seconds, self.steps = 0.0, 0
        journal = Journal.from_env()
        if journal is not None and mine["rank"] == 0:
            journal.write(
                "ranks",
                step=step,
                ranks=ranks,
                message=f"compute seconds per step over the last {self.every} steps, by rank",
            )
