"""At which steps the reference trainer saves to the file system: every ``checkpoint.every_steps``; every
``every_minutes`` (in steps of the measured step time); or ``"auto"``, the interval that loses the least time to
interruptions plus saves (hpctrain.checkpoint.interval) from the measured saves and the interruptions that lost
work of this job and of jobs alike, on the site's prior (``checkpoint.mtbi_hours``), at most the site's
``max_interval_minutes``. The memory tier
(``memory_every_steps``) likewise, from its own saves and the interruptions it serves: job steps restarted in
place, on the site's ``mtbi_hours`` (a failure's rate; preemptions end the allocation, and its memory with it).

An interval in minutes or "auto" is chosen WARMUP_STEPS steps in (where "auto" saves first, to measure a save,
unless an earlier start of this task measured one: a job step restarted in place, or a requeued run, goes on from
its journaled measurements) and again after each save: at the same step on every rank, from measurements reduced over the ranks (the slowest
rank's), so that every rank saves at the same steps. Rank 0 journals each choice that changes the interval
(``checkpoint_interval``: `hpctrain show` lists it with why).

Rank 0 commits the saves: a commit that takes the site's ``[alerts] slow_save_factor`` times the median of the
ones before is a ``slow_save`` event (the file system slowed down). "auto" then waits at least that long before
the next save instead of letting saves pile up: the newest commit counts when it is the longest.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from hpctrain.checkpoint.interval import MAX_INTERVAL_S, InterruptionRate, Interval, choose_interval
from hpctrain.config.job import CheckpointPolicy
from hpctrain.config.site import Alerts
from hpctrain.parallel.collective import all_reduce_floats

WARMUP_STEPS = 10
KEPT = 20  # the newest measurements of each kind that count
CHANGE = 0.1  # a new interval is journaled when it differs from the last journaled one by more than this share
SLOW_AFTER = 3  # commits measured before one can be slow


class SaveSchedule:
    def __init__(
        self,
        policy: CheckpointPolicy,
        history: tuple[int, float] = (0, 0.0),
        prior_mtbi_s: float = 24 * 3600.0,
        journal: Any = None,
        slow_factor: float = Alerts().slow_save_factor,
        clock: Callable[[], float] = time.monotonic,
        memory: bool = False,
        max_interval_s: float = MAX_INTERVAL_S,
        measured: tuple[float, float, float] | None = None,
    ) -> None:
        """``history``: the interruptions that lost work and the seconds run before this process (runtime.attempts);
        the ``journal`` is rank 0's, None elsewhere; a commit ``slow_factor`` times the usual one is slow. With
        ``memory``, the memory tier's schedule (``memory_every_steps``; its slow saves are not the file system's).
        "auto" saves at most ``max_interval_s`` apart. ``measured``: (a save's blocked seconds, its seconds to commit,
        a step's seconds) as an earlier start of this task measured them (`earlier_measurements`)."""
        every, minutes = (policy.memory_every_steps, None) if memory else (policy.every_steps, policy.every_minutes)
        self.every = every if isinstance(every, int) else None
        self.minutes = minutes if isinstance(minutes, (int, float)) else None
        self.auto = "auto" in (every, minutes)
        self.memory = memory
        self.events, self.earlier_s = history
        self.prior_mtbi_s, self.journal, self.slow_factor, self.clock = prior_mtbi_s, journal, slow_factor, clock
        self.max_interval_s = max_interval_s
        self.started = clock()
        self.step_times: deque[float] = deque(maxlen=KEPT)
        self.blocked: deque[float] = deque(maxlen=KEPT)
        self.commits: deque[float] = deque(maxlen=KEPT)
        self.pending: list[tuple[int, float, Future[Any]]] = []  # saves in flight: (step, begun, future)
        self.next_save: int | None = None
        self.next_choice: int | None = None
        self.journaled: Interval | None = None
        if measured is not None:
            for kept, value in zip((self.blocked, self.commits, self.step_times), measured):
                kept.append(value)

    def begin(self, start_step: int) -> None:
        """The run trains on from ``start_step``: an interval in minutes or "auto" is chosen WARMUP_STEPS later
        ("auto" saves there first where no save was measured)."""
        if self.auto or self.minutes is not None:
            self.next_choice = start_step + WARMUP_STEPS
            self.next_save = self.next_choice if self.auto and not self.blocked else None

    def due(self, step: int) -> bool:
        """Whether the file-system tier saves at ``step`` (the same answer on every rank)."""
        if self.every is not None:
            return step % self.every == 0
        return step == self.next_save

    def step_done(self, step_time_s: float) -> None:
        self.step_times.append(step_time_s)
        self._collect()

    def saved(self, step: int, blocked_s: float, future: Future[Any]) -> None:
        """The save of ``step`` blocked the step ``blocked_s``; ``future`` completes once this rank's part is
        written (and, on the committing rank, committed)."""
        self.blocked.append(blocked_s)
        self.pending.append((step, self.clock() - blocked_s, future))

    def _collect(self) -> None:
        """The saves found done since the last step: each one's time to commit (a step or less late)."""
        for save in [s for s in self.pending if s[2].done()]:
            self.pending.remove(save)
            self._committed(save[0], self.clock() - save[1])

    def _committed(self, step: int, seconds: float) -> None:
        """A commit measured; a slow one journaled."""
        before = list(self.commits)
        self.commits.append(seconds)
        if self.journal is None or self.memory or len(before) < SLOW_AFTER:
            return
        if seconds <= self.slow_factor * (usual := statistics.median(before)):
            return
        self.journal.write(
            "slow_save",
            step=step,
            seconds=round(seconds, 3),
            usual_s=round(usual, 3),
            message=f"the checkpoint of step {step} took {seconds:.1f} s to commit, {seconds / usual:.0f}x the "
            f"median of the {len(before)} before ({usual:.1f} s): the checkpoint file system is slow"
            + ('; "auto" waits for it' if self.auto else ""),
        )

    def choose(self, step: int) -> Interval | None:
        """At a choosing step (collective): the next interval, and the step of the next save; None elsewhere."""
        if step != self.next_choice:
            return None
        self._collect()  # a save just made waited for the one before it
        newest = self.commits[-1] if self.commits else 0.0
        step_s, cost_s, commit_s, exposure_s = all_reduce_floats(
            [
                _median(self.step_times),
                _median(self.blocked),
                max(_median(self.commits), newest),
                self.earlier_s + self.clock() - self.started,
            ],
            "max",
        )
        rate = self.rate(exposure_s)
        if self.minutes is not None:
            steps = max(1, round(self.minutes * 60 / step_s)) if step_s > 0 else 1
            interval = Interval(steps, steps * step_s, cost_s, commit_s, step_s, rate.mtbi_s)
            why = f"every {steps} steps: {self.minutes:g} minutes at {step_s:.3f} s a step"
        else:
            interval = choose_interval(cost_s, commit_s, step_s, rate, self.max_interval_s)
            why = interval.why(rate)
        self.next_save = self.next_choice = step + interval.steps
        self._journal(step, interval, why, rate)
        return interval

    def rate(self, exposure_s: float) -> InterruptionRate:
        return InterruptionRate(self.events, exposure_s, prior_s=self.prior_mtbi_s)

    def _journal(self, step: int, interval: Interval, why: str, rate: InterruptionRate) -> None:
        last = self.journaled
        if self.journal is None or (last is not None and abs(interval.steps - last.steps) <= CHANGE * last.steps):
            return
        self.journaled = interval
        self.journal.write(
            "checkpoint_interval",
            tier="memory" if self.memory else "file system",
            step=step,
            steps=interval.steps,
            seconds=round(interval.seconds, 3),
            cost_s=round(interval.cost_s, 4),
            commit_s=round(interval.commit_s, 3),
            step_s=round(interval.step_s, 4),
            mtbi_s=round(rate.mtbi_s, 1),
            message=f"{'memory-tier checkpoints' if self.memory else 'checkpoints'} {why}",
        )


def _median(values: deque[float] | list[float]) -> float:
    return statistics.median(values) if values else 0.0


def earlier_measurements(journal: Any, task_index: int, memory: bool) -> tuple[float, float, float] | None:
    """The newest measurements an earlier start of this task journaled with its interval for this tier: (a save's
    blocked seconds, its seconds to commit, a step's seconds); None before any."""
    tier = "memory" if memory else "file system"
    newest = None
    for _, rec in journal.records(kinds=("checkpoint_interval",)):
        if rec.get("task_index", -1) == task_index and rec.get("tier", "file system") == tier:
            newest = rec
    if newest is None or "cost_s" not in newest:
        return None
    return float(newest["cost_s"]), float(newest["commit_s"]), float(newest["step_s"])
