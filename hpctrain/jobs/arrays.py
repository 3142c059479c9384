"""What `hpctrain show` lists of a job's runs: every run of a plain job or a small array; of a big array (more than
LIST_TASKS tasks), its tasks counted by state, and the runs of only the tasks the user names (by index or state)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from hpctrain.errors import HpctrainError
from hpctrain.ledger.rows import ArrayTaskRow, AttemptRow

LIST_TASKS = 20


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
