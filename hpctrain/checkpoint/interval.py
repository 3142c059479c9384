"""When to checkpoint: the interval that loses the least time to interruptions plus checkpoint overhead, from a
save's measured cost and the rate of interruptions (Young 1974; Daly 2006, "A higher order estimate of the
optimum checkpoint interval for restart dumps").

Per interval T a save blocks training C seconds; an interruption that loses work (a crash, a node failure, a hang,
a kill without notice) loses the work since the newest committed checkpoint (T/2 on average, plus the R seconds a
save takes to commit) and comes every M seconds on average, so the share of time lost is about C/T + (T/2 + R)/M,
least at T = sqrt(2CM); Daly's estimate adds the higher-order terms. A preemption announced in time and the time
limit are not in M: their notice saves a stop checkpoint, and nothing is lost. R does not move the optimum but
bounds it from below: a save starts only once the one before has committed, or saves pile up; nor is T shorter than
C (at most half the time spent saving). From above T is capped (``max_s``): the training a crash may lose.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# A save's cost is never taken below this (an async save's blocked time can be a millisecond: the interval would
# follow the noise of the clock).
MIN_COST_S = 0.01
# The longest interval by default (the site's ``[checkpoint] max_interval_minutes``).
MAX_INTERVAL_S = 120 * 60.0


def daly_interval_s(cost_s: float, mtbi_s: float) -> float:
    """Daly's optimum compute time between saves of cost ``cost_s``, interruptions every ``mtbi_s`` on average."""
    if cost_s >= 2 * mtbi_s:
        return mtbi_s
    x = math.sqrt(cost_s / (2 * mtbi_s))
    return math.sqrt(2 * cost_s * mtbi_s) * (1 + x / 3 + x * x / 9) - cost_s


@dataclass(frozen=True)
class InterruptionRate:
    """Interruptions that lost work seen over seconds of running, on top of a prior (the site's guess:
    ``prior_events`` interruptions over ``prior_s`` seconds) that fades as interruptions are seen."""

    events: float
    exposure_s: float
    prior_events: float = 1.0
    prior_s: float = 24 * 3600.0

    @property
    def mtbi_s(self) -> float:
        """The mean time between interruptions: (prior + seen seconds) / (prior + seen interruptions), the prior
        weighted 1 / (1 + seen interruptions). Weighted whole, its seconds held the rate down wherever the site's
        guess was far off: a prior of one a day kept a history of 1,151 interruptions in 6 h at one every 94 s
        instead of 19 s, and the interval 2.5x too long (benchmarks/interval_real.py)."""
        weight = 1.0 / (1.0 + self.events)
        return (weight * self.prior_s + self.exposure_s) / (weight * self.prior_events + self.events)

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
            f"{self.commit_s:.1f} s, a step takes {self.step_s:.3f} s, interruptions that lose work "
            f"{rate.describe()}"
        )


def interval_s(cost_s: float, commit_s: float, mtbi_s: float, max_s: float = MAX_INTERVAL_S) -> float:
    """The compute seconds between saves: Daly's optimum for a save of ``cost_s`` and interruptions that lose work
    every ``mtbi_s``, at most ``max_s``, and no shorter than a save blocks nor than it takes to commit."""
    return max(min(daly_interval_s(max(cost_s, MIN_COST_S), mtbi_s), max_s), cost_s, commit_s)


def choose_interval(
    cost_s: float, commit_s: float, step_s: float, rate: InterruptionRate, max_s: float = MAX_INTERVAL_S
) -> Interval:
    """The interval in steps (`interval_s`), no shorter than a commit."""
    best = interval_s(cost_s, commit_s, rate.mtbi_s, max_s)
    steps = max(1, round(best / step_s), math.ceil(commit_s / step_s)) if step_s > 0 else 1
    return Interval(steps, steps * step_s, cost_s, commit_s, step_s, rate.mtbi_s)
