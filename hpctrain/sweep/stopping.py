"""Early-stopping decisions on intermediate metrics: pure functions, the caller cancels the trials.

Rules (``TrialRecord.intermediate`` holds the early-stopping metric by step; every trial's curve
counts as a reference, whatever its state):

- median (Optuna's MedianPruner): at its latest step s, a trial stops when its best value so far
  is worse than the median of the other trials' values at step s exactly. No decision before
  grace_steps, or with fewer than min_trials other trials reporting at s.
- halving (asynchronous successive halving): rungs at min_resource * reduction_factor**k. A trial
  is judged at the highest rung r it has reached (latest step >= r), by its best value at steps
  <= r, against every trial that reached r; it continues while it ranks within the top
  ceil(n / reduction_factor) of those n trials (ties continue). Later arrivals at r can still
  push it out. No decision at rungs below grace_steps, or with fewer than min_trials others at r.

Under either rule a trial whose latest value is NaN or infinite (diverged) stops, once past grace_steps.

Why not Optuna's pruners: they are asked at every step of a trial that reports to them, while a cron tick
sees curves after the fact. Optuna's MedianPruner compares with completed trials only, and a cron sweep's
first batch of max_parallel trials may be all there is, so it could stop none of them. Its
SuccessiveHalvingPruner keeps the value it sees when first asked past a rung, so its decision depends on
when a tick happens to look; here a trial is judged by its best value by the rung, whenever that is. It
keeps floor(n / reduction_factor) (at least one) where this keeps ceil: with a small sweep's few trials at
a rung, the second best of four is not stopped. Where the inputs coincide, both rules decide exactly as
Optuna's pruners do (tests/unit/sweep/test_sweep_stopping.py checks it, and shows each difference).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator

from hpctrain.sweep.methods import TrialRecord
from hpctrain.sweep.spec import EarlyStopping, SweepSpec


def should_stop(spec: SweepSpec, trial: TrialRecord, others: Iterable[TrialRecord]) -> str | None:
    """Why ``trial`` should stop now, judged against ``others``; None to let it run."""
    trials = [trial, *(t for t in others if t.number != trial.number)]
    return _Judge(spec, trials).reason(trial) if spec.early_stopping else None


def trials_to_stop(spec: SweepSpec, trials: list[TrialRecord]) -> dict[int, str]:
    """Trial number -> reason, for every running trial that should stop now."""
    running = [t for t in trials if t.state == "running"]
    if spec.early_stopping is None or not running:
        return {}
    judge = _Judge(spec, trials)
    return {t.number: reason for t in running if (reason := judge.reason(t))}


class _Judge:
    """Sorted reference values for every step (median) or rung (halving), built once over all trials.

    Values are signed so that lower is better whatever the direction.
    """

    def __init__(self, spec: SweepSpec, trials: list[TrialRecord]) -> None:
        assert spec.early_stopping is not None
        self.es: EarlyStopping = spec.early_stopping
        self.sign = 1.0 if spec.direction == "minimize" else -1.0
        self.board: dict[int, list[float]] = defaultdict(list)
        # The newest step of the running trial furthest behind: one ahead of it is judged where enough have reported.
        self.slowest_running = min(
            (max(t.intermediate) for t in trials if t.state == "running" and t.intermediate), default=math.inf
        )
        for t in trials:
            for step, value in self._scores(t).items():
                self.board[step].append(value)
        for values in self.board.values():
            values.sort()

    def _scores(self, trial: TrialRecord) -> dict[int, float]:
        if self.es.rule == "median":
            return {s: self.sign * v for s, v in trial.intermediate.items() if math.isfinite(v)}
        return self._rung_scores(trial)

    def _rung_scores(self, trial: TrialRecord) -> dict[int, float]:
        """The trial's best signed value by each rung it reached."""
        if not trial.intermediate:
            return {}
        points = sorted((s, self.sign * v) for s, v in trial.intermediate.items() if math.isfinite(v))
        scores, best, i = {}, math.inf, 0
        for rung in self._rungs(max(trial.intermediate)):
            while i < len(points) and points[i][0] <= rung:
                best, i = min(best, points[i][1]), i + 1
            if best < math.inf:
                scores[rung] = best
        return scores

    def _rungs(self, last_step: int) -> Iterator[int]:
        rung = self.es.min_resource
        while rung <= last_step:
            yield rung
            rung *= self.es.reduction_factor

    def reason(self, trial: TrialRecord) -> str | None:
        if not trial.intermediate:
            return None
        step = max(trial.intermediate)
        if step < self.es.grace_steps:
            return None
        if not math.isfinite(trial.intermediate[step]):
            return f"{self.es.metric} is {trial.intermediate[step]} at step {step}: diverged"
        return self._median(trial, step) if self.es.rule == "median" else self._halving(trial)

    def _median(self, trial: TrialRecord, last: int) -> str | None:
        step = self._median_step(trial, last)
        if step is None:
            return None
        values, scores = self.board[step], self._scores(trial)
        median = _median_without(values, scores[step])
        best = min(v for s, v in scores.items() if s <= step)
        if best <= median:
            return None
        return (
            f"median stopping: best {self.es.metric} {self.sign * best:.4g} by step {step} is worse than "
            f"the median {self.sign * median:.4g} of {len(values) - 1} other trials at that step"
        )

    def _median_step(self, trial: TrialRecord, last: int) -> int | None:
        """The step ``trial`` is judged at: its newest, where at least min_trials others reported it, as Optuna's
        MedianPruner does. Where running trials have not reached that step yet (a cron tick sees trials a step
        apart, and would never see enough of them at the newest step of the one ahead), the newest of its steps
        since grace that enough of them have reached."""
        if len(self.board[last]) - 1 >= self.es.min_trials:
            return last
        if self.slowest_running >= last:  # none behind it (the slowest is not the trial itself: it is at `last`)
            return None
        earlier = (
            s
            for s in sorted(self._scores(trial), reverse=True)
            if self.es.grace_steps <= s < last and len(self.board[s]) - 1 >= self.es.min_trials
        )
        return next(earlier, None)

    def _halving(self, trial: TrialRecord) -> str | None:
        scores = self._rung_scores(trial)
        if not scores:
            return None
        rung = max(scores)
        values, own = self.board[rung], scores[rung]
        if rung < self.es.grace_steps or len(values) - 1 < self.es.min_trials:
            return None
        keep = math.ceil(len(values) / self.es.reduction_factor)
        rank = bisect.bisect_left(values, own)  # trials strictly better
        if rank < keep:
            return None
        return (
            f"successive halving: best {self.es.metric} {self.sign * own:.4g} by rung step {rung} ranks "
            f"{rank + 1} of {len(values)} trials there; only the top {keep} continue"
        )


def _median_without(values: list[float], own: float) -> float:
    """Median of sorted ``values`` less one occurrence of ``own`` (which must be among them)."""
    pos = bisect.bisect_left(values, own)
    m = len(values) - 1

    def at(i: int) -> float:
        return values[i] if i < pos else values[i + 1]

    return (at((m - 1) // 2) + at(m // 2)) / 2
