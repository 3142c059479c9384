"""Shared by the benchmarks: a Slurm client that accounts for the seconds spent inside Slurm's commands."""

from __future__ import annotations

import time

from hpctrain.slurm import SlurmClient


class TimedClient(SlurmClient):
    """Counts Slurm's own time apart from hpctrain's; with ``held``, submits held jobs (nothing runs)."""

    slurm_seconds = 0.0
    held = False

    def run(self, command: str, *args: str, **kw) -> str:  # type: ignore[override]
        t0 = time.perf_counter()
        try:
            if command == "sbatch" and self.held:
                args = ("--hold", *args)
            return super().run(command, *args, **kw)
        finally:
            self.slurm_seconds += time.perf_counter() - t0

    def reset(self) -> None:
        self.slurm_seconds, self.calls = 0.0, self.calls.__class__()
