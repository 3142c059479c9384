"""Functions the executor tests submit (pickled by value: the compute side cannot import tests/)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import cloudpickle
import submitit

from hpctrain.runtime.function import requeue, should_stop


def add(a: int, b: int) -> int:
    if a == 2:
        raise ValueError("two is refused")
    return a + b


class Loop(submitit.helpers.Checkpointable):
    """A stateful loop: ``steps`` steps of ``step_s`` seconds, each appended to ``progress`` as it begins (so a
    test sees every step run, in every attempt, and one cut short). ``guarded``: it asks `should_stop()` after each step and requeues at that
    boundary; else the notice interrupts it wherever it is (submitit's way)."""

    def __init__(self, steps: int, progress: Path, step_s: float = 0.1, guarded: bool = True):
        self.steps, self.progress, self.step_s, self.guarded = steps, Path(progress), step_s, guarded
        self.step, self.total, self.starts = 0, 0, []

    def __call__(self) -> dict[str, Any]:
        self.starts.append(self.step)
        while self.step < self.steps:
            with self.progress.open("a") as f:
                f.write(f"{self.step + 1}\n")
            time.sleep(self.step_s)
            self.step, self.total = self.step + 1, self.total + self.step + 1
            if self.guarded and should_stop():
                requeue()
        return {"step": self.step, "total": self.total, "starts": self.starts}


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # this module, not the whole helpers package
