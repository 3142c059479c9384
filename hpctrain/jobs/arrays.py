"""What `hpctrain show` lists of a job's runs: every run of a plain job or a small array; of a big array (more than
LIST_TASKS tasks), its tasks counted by state, and the runs of only the tasks the user names (by index or state). Of
an array split past MaxArraySize, each part of the submission on one line; of a job's events, the newest
EVENTS_SHOWN, the ones before counted by kind."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.ledger.rows import ArrayTaskRow, AttemptRow, LoggedEvent

LIST_TASKS = 20
EVENTS_SHOWN = 30


@dataclass
class Part:
    """One job of a submission split past MaxArraySize: its ids, its tasks counted by state."""

    id: int
    slurm_job_id: str | None
    state: str
    tasks: int
    by_state: dict[str, int]


def parts_of(jobs: Sequence[Mapping[str, Any]], tasks: Sequence[ArrayTaskRow]) -> list[Part]:
    """The parts of a submission (``jobs``, one group) and their tasks (``tasks``, of all of them), by ledger id."""
    counts: dict[int, Counter[str]] = {j["id"]: Counter() for j in jobs}
    for t in tasks:
        counts[t["job_id"]][t["state"]] += 1
    return [
        Part(j["id"], j["slurm_job_id"], j["state"], sum(counts[j["id"]].values()), dict(counts[j["id"]].most_common()))
        for j in sorted(jobs, key=lambda j: j["id"])
    ]


def newest_events(events: Sequence[LoggedEvent], shown: int = EVENTS_SHOWN) -> tuple[list[LoggedEvent], dict[str, int]]:
    """The newest ``shown`` of a job's ``events`` (in time order), and the kinds of the ones before, counted."""
    ordered = sorted(events, key=lambda e: e["time"])
    earlier, newest = ordered[: max(len(ordered) - shown, 0)], ordered[-shown:] if shown else []
    return newest, dict(Counter(e["kind"] for e in earlier).most_common())


@dataclass
class RunsView:
    by_state: dict[str, int]  # an array's tasks per state (empty for a plain job)
    runs: list[AttemptRow]  # the runs to list
    summarised: bool  # a big array, nothing asked for: its counts stand for its runs


def runs_view(
    job_id: int,
    tasks: Sequence[ArrayTaskRow],
    runs: Sequence[AttemptRow],
    task: int | None = None,
    state: str | None = None,
) -> RunsView:
    """The runs of ``task`` (an index) or of the tasks in ``state``, else all of them unless the array is big."""
    if (task is not None or state is not None) and not tasks:
        raise HpctrainError(f"job {job_id} is no array: --task and --state pick array tasks")
    if task is not None and task not in {t["task_index"] for t in tasks}:
        raise HpctrainError(f"job {job_id} has no task {task} (tasks 0 to {max(t['task_index'] for t in tasks)})")
    by_state = dict(Counter(t["state"] for t in tasks).most_common())
    if task is None and state is None:
        big = len(tasks) > LIST_TASKS
        return RunsView(by_state, [] if big else list(runs), big)
    picked = {t["task_index"] for t in tasks if t["task_index"] == task or (state and t["state"] == state.upper())}
    return RunsView(by_state, [r for r in runs if r["task_index"] in picked], False)
