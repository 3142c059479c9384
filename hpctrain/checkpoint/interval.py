"""When to checkpoint: the interval that loses the least time to interruptions plus checkpoint overhead, from a
save's measured cost and the rate of interruptions (Young 1974; Daly 2006, "A higher order estimate of the
optimum checkpoint interval for restart dumps").

Per interval T a save blocks training C seconds; an interruption loses the work since the newest committed
checkpoint (T/2 on average, plus the R seconds a save takes to commit) and comes every M seconds on average, so
the share of time lost is about C/T + (T/2 + R)/M, least at T = sqrt(2CM); Daly's estimate adds the higher-order
terms. R does not move the optimum but bounds it from below: a save starts only once the one before has committed,
or saves pile up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# A save's cost is never taken below this (an async save's blocked time can be a millisecond: the interval would
# follow the noise of the clock).
MIN_COST_S = 0.01


def daly_interval_s(cost_s: float, mtbi_s: float) -> float:
    """Daly's optimum compute time between saves of cost ``cost_s``, interruptions every ``mtbi_s`` on average."""
    if cost_s >= 2 * mtbi_s:
        return mtbi_s
    x = math.sqrt(cost_s / (2 * mtbi_s))
    return math.sqrt(2 * cost_s * mtbi_s) * (1 + x / 3 + x * x / 9) - cost_s


@dataclass(frozen=True)
class InterruptionRate:
    """Interruptions seen over seconds of running, on top of a prior (the site's guess, worth ``prior_events``
    interruptions over ``prior_s`` seconds) that the history outweighs as it grows."""

    events: float
    exposure_s: float
    prior_events: float = 1.0
    prior_s: float = 24 * 3600.0

    @property
    def mtbi_s(self) -> float:
        """The mean time between interruptions: (prior + seen seconds) / (prior + seen interruptions)."""
        return (self.prior_s + self.exposure_s) / (self.prior_events + self.events)

    def describe(self) -> str:
        seen = f"{self.events:g} in {self.exposure_s / 3600:.1f} h seen" if self.exposure_s else "none seen yet"
        return (
            f"one every {_duration(self.mtbi_s)} ({seen}, prior one in {self.prior_s / self.prior_events / 3600:g} h)"
        )


def _duration(seconds: float) -> str:
    """An hour or more in hours, else in minutes, under two minutes in seconds."""
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


@dataclass(frozen=True)
class Interval:
    """A chosen interval, and what it was chosen from."""

    steps: int
    seconds: float
    cost_s: float  # a save's blocked seconds
    commit_s: float  # a save's seconds to commit
    step_s: float  # a training step's seconds
    mtbi_s: float

    def why(self, rate: InterruptionRate) -> str:
        return (
            f"every {self.steps} steps ({self.seconds:.0f} s): a save blocks {self.cost_s:.3f} s and commits in "
            f"{self.commit_s:.1f} s, a step takes {self.step_s:.3f} s, interruptions {rate.describe()}"
        )


def choose_interval(cost_s: float, commit_s: float, step_s: float, rate: InterruptionRate) -> Interval:
    """The interval in steps: Daly's optimum for the measured ``cost_s`` and ``rate``, no shorter than a commit."""
    best = daly_interval_s(max(cost_s, MIN_COST_S), rate.mtbi_s)
    steps = max(1, round(best / step_s), math.ceil(commit_s / step_s)) if step_s > 0 else 1
    return Interval(steps, steps * step_s, cost_s, commit_s, step_s, rate.mtbi_s)
