"""What `hpctrain status` shows by default, bounded at any number of active jobs: the active submissions one a line
while they are few, else counted by group (a sweep's, or the submissions of one name) and state, followed by the
submissions that need the user's eye (alerts, waits, sessions), at most a screenful of each."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from hpctrain.ledger.rows import JobSummary

LISTED_WHOLE = 20  # this many active submissions or fewer: each on its line
GROUPS_SHOWN = 15
NOTES_SHOWN = 20


class Note(NamedTuple):
    """A line on one submission: an alert, why it waits, its session."""

    job_id: int
    text: str
    alert: bool = False


@dataclass
class Group:
    """The active submissions of one sweep, or of one name outside sweeps."""

    name: str
    submissions: int = 0
    states: Counter[str] = field(default_factory=Counter)
    tasks: Counter[str] = field(default_factory=Counter)
    restarts: int = 0
    preemptions: int = 0


@dataclass
class Overview:
    """Groups (the largest first, at most GROUPS_SHOWN) and how many more; notes (one per submission that needs the
    eye, at most NOTES_SHOWN) and how many more."""

    groups: list[Group]
    more_groups: int
    notes: list[Note]
    more_notes: int


def group_of(row: JobSummary) -> str:
    return f"sweep {row['sweep_id']}" if row["sweep_id"] else row["name"]


def overview(rows: Sequence[JobSummary], notes: Mapping[int, Sequence[Note]]) -> Overview:
    """``rows`` (one per submission, see `poll.submissions`) grouped; ``notes``: what to say of a submission, by its
    id, kept in the order of ``rows``."""
    groups: dict[str, Group] = {}
    for r in rows:
        g = groups.setdefault(group_of(r), Group(group_of(r)))
        g.submissions += 1
        g.states[r["state"]] += 1
        for item in filter(None, (r["task_states"] or "").split(",")):
            state, n = item.rsplit(":", 1)
            g.tasks[state] += int(n)
        g.restarts += r["restarts"]
        g.preemptions += r["preemptions"]
    ordered = sorted(groups.values(), key=lambda g: (-g.submissions, g.name))
    said = [note for r in rows for note in notes.get(r["id"], ())]
    return Overview(
        ordered[:GROUPS_SHOWN], max(len(ordered) - GROUPS_SHOWN, 0), said[:NOTES_SHOWN], max(len(said) - NOTES_SHOWN, 0)
    )


def counted(counts: Mapping[str, int]) -> str:
    """'12 RUNNING, 3 PENDING': the most first."""
    return ", ".join(f"{n:,} {state}" for state, n in sorted(counts.items(), key=lambda c: (-c[1], c[0]))) or "-"
