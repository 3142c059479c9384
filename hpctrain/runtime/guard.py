"""Notice preemption and time limits inside the job, and agree on them across ranks at a step boundary.

USR2 is the sbatch notice (`--signal=B:USR2@lead`, forwarded by hpctrain's batch script), SIGTERM
is what preemption sends on sites without user signals, SIGHUP covers a lost session. USR1 is
never used: NCCL takes it. Every rank calls `should_stop()` after each step; one all-reduce of a
single flag makes all of them stop at the same step, as Megatron does.
"""

from __future__ import annotations

import signal
import time
from types import FrameType
from typing import Callable

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP)


class PreemptionGuard:
    def __init__(self, end_time: Callable[[], float | None] = lambda: None, timeout_margin_s: float = 600.0):
        """``end_time`` gives the job's end (epoch seconds) when asked; within ``timeout_margin_s`` of it a
        stop is a time limit, otherwise a preemption: told by remaining wall time, not by the signal."""
        self.end_time, self.timeout_margin_s = end_time, timeout_margin_s
        self.signal: int | None = None
        self.received_at: float | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal, self.received_at = signum, time.time()

    def should_stop(self) -> bool:
        """Collective when torch.distributed is initialised: True on every rank once any rank got a signal
        (``signal`` then holds the highest signal number any rank got)."""
        try:
            import torch.distributed as dist
        except ImportError:
            return self.signal is not None
        if dist.is_available() and dist.is_initialized():
            import torch

            flag = torch.tensor([self.signal or 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            self.signal = int(flag.item()) or None
        return self.signal is not None

    def cause(self) -> str:
        """'timeout' when the job's end is near, else 'preemption'."""
        end = self.end_time()
        if end is not None and end - time.time() <= self.timeout_margin_s:
            return "timeout"
        return "preemption"

    def uninstall(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
