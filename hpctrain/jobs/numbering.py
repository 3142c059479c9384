"""Attempt numbers for sacct's runs of a task, reconciled with the job's journal where Slurm's accounting is wrong.

hpctrain numbers a task's runs by their place in `sacct -X -D` (from the job's attempt base). Requeueing a job that
is still COMPLETING makes Slurm (22.05 to 26.05.3 at least) overwrite the previous run's accounting row with the
requeue's: its start time goes missing and the restart count is bumped, so a run disappears from the list and the
runs after it take the wrong places. The shape is recognised here: a row without a start that a later row follows
or that was queued no later than a run that started, a row without a start where the ledger had a run that started,
or the ledger knowing more runs than sacct lists.
Then the journal, written by the runs themselves (the batch script's attempt_start of each run), wins: each sacct
run that started takes the number of the journaled run that started within it, a row that lost its start is left
out (the run it overwrote keeps what the ledger knew of it), and a last row not yet started is the run after the
journal's last.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from hpctrain.contract import JobPaths
from hpctrain.ledger.journal import Journal
from hpctrain.slurm.sacct import Attempt

SKEW_S = 30.0  # a run's attempt_start is journaled this long before Slurm's start at most (node clocks)


def overwritten(attempts: list[Attempt], base: int, known_starts: Mapping[int, float | None]) -> bool:
    """Whether a task's sacct runs have the shape of Slurm's requeue-while-completing bug. ``known_starts``: the
    start of each run the ledger knows, by number (None: not started, or known from the journal only); a run it
    knows past sacct's last is one sacct's list lost (or an array task's pending-range row: the journal then
    numbers it as its place does)."""
    last = base + len(attempts) - 1
    return (
        any(_lost(a, i, attempts) for i, a in enumerate(attempts))
        or any(a.start is None and known_starts.get(n) is not None for n, a in enumerate(attempts, base))
        or any(n > last for n in known_starts)
    )


def numbered(
    attempts: list[Attempt],
    base: int,
    known_starts: Mapping[int, float | None],
    journaled: Callable[[], Mapping[int, float]],
) -> list[tuple[int, Attempt]]:
    """A task's sacct runs with their attempt numbers: by place from ``base``, unless the history is `overwritten`
    and the journal knows its runs (``journaled``, read only then: each run's number and attempt_start time)."""
    plain = list(enumerate(attempts, base))
    if not overwritten(attempts, base, known_starts) or not (starts := dict(journaled())):
        return plain
    out: list[tuple[int, Attempt]] = []
    taken: set[int] = set()
    for i, a in enumerate(attempts):
        if a.start is None:
            if not _lost(a, i, attempts):  # the next run, pending: after every run the journal or sacct knows
                out.append((max([*starts, *taken, base - 1]) + 1, a))
            continue  # the row that overwrote a run's: the run keeps what the ledger knew of it
        start, end = a.start, a.end if a.end is not None else float("inf")
        within = [n for n, t in starts.items() if n not in taken and start - SKEW_S <= t <= end]
        if within:
            number = min(within, key=lambda n: abs(starts[n] - start))
        else:  # a run the journal does not know (its batch script wrote nothing): after the one before
            number = max([*taken, base - 1]) + 1
        taken.add(number)
        out.append((number, a))
    return out


def _lost(a: Attempt, i: int, attempts: list[Attempt]) -> bool:
    """A row without a start that is no run waiting to start: another row follows it, or a run that started was
    queued no earlier (sacct sorts a row without a start last among rows queued at once)."""
    if a.start is not None:
        return False
    queued = [b.submit or 0.0 for b in attempts if b.start is not None]
    return i < len(attempts) - 1 or (a.submit or 0.0) <= max(queued, default=float("-inf"))


def journaled_starts(job_dir: str | None, task_index: int) -> dict[int, float]:
    """The task's runs its batch script journaled: attempt number -> when its attempt_start was written."""
    if not job_dir:
        return {}
    journal = Journal(JobPaths(Path(job_dir)).journal_dir)
    return {
        rec["attempt"]: rec["time"]
        for _, rec in journal.records(["attempt_start"])
        if rec.get("task_index", -1) == task_index and rec.get("attempt") is not None
    }
