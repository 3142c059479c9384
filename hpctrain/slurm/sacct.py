"""sacct's answer as attempt histories: one row per allocation attempt of a job or array task.

`sacct -X -D` lists one row per allocation attempt (a requeued or preempted run keeps its row),
with array tasks expanded and a still-pending task range in one row. Restart and preemption
counts come from those rows (sacct in 22.05 has no restart-count field). A run whose allocation
shrank (a node failed under --no-kill) is listed in parts, each but the last RESIZING: they are
one run here, its GPU-seconds the parts' sum.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypeVar

from hpctrain.slurm.parse import Parsable
from hpctrain.slurm.states import REQUEUE_STATES, normal_state

# ElapsedRaw last: a running job's grows on every poll, and `digest` leaves it out (see there).
FIELDS = ("JobID", "State", "ExitCode", "Submit", "Start", "End", "NodeList", "AllocTRES", "Reason", "ElapsedRaw")
GROWS = "ElapsedRaw"
_JOBID = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]*\]))?$")
_JOBID_FIRST = re.compile(r"\s*(\d+)(?:_(?:\d+|\[[^\]]*\]))?\s*(?:\||$)")  # _JOBID as a line's first column
_GPUS = re.compile(r"gres/gpu(?::[^=,]+)?=(\d+)")
_N = TypeVar("_N", int, float)


def expand_task_range(text: str) -> list[int]:
    """'[2-4,7%2]' -> [2, 3, 4, 7]."""
    tasks: list[int] = []
    for part in text.strip("[]").split("%")[0].split(","):
        lo, _, hi = part.partition("-")
        tasks.extend(range(int(lo), int(hi or lo) + 1))
    return tasks


def parse_time(text: str) -> float | None:
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


@dataclass
class Attempt:
    state: str
    submit: float | None
    start: float | None
    end: float | None
    node_list: str
    exit_code: str
    gpus: int
    reason: str
    elapsed_s: int | None = None
    gpu_s: float | None = None  # GPUs x elapsed, summed over the parts of a resized run

    def __post_init__(self) -> None:
        if self.gpu_s is None and self.elapsed_s is not None:
            self.gpu_s = float(self.gpus * self.elapsed_s)


@dataclass
class TaskHistory:
    """All attempts of one job or array task, oldest first."""

    attempts: list[Attempt] = field(default_factory=list)
    requeue: bool = True
    requeued_by_us: bool = False

    @property
    def state(self) -> str:
        last = self.attempts[-1].state
        if self.requeued_by_us or (self.requeue and last in REQUEUE_STATES):
            return "REQUEUED"
        return last

    @property
    def restarts(self) -> int:
        return len(self.attempts) - 1


def by_job(rows: Sequence[dict[str, str]]) -> dict[str, Sequence[dict[str, str]]]:
    """sacct rows -> {base job id: its rows, in sacct's order}; rows of job steps left out. Rows still as text
    (sacct's own answer) stay text, grouped by the job id alone."""
    if isinstance(rows, Parsable):
        lines: dict[str, list[str]] = {}
        if rows.header[:1] == ["JobID"]:  # as FIELDS ask: the line's start says it, without splitting it
            for line in rows.lines:
                if m := _JOBID_FIRST.match(line):
                    lines.setdefault(m[1], []).append(line)
        else:
            for job_id, line in rows.column("JobID"):
                if m := _JOBID.match(job_id):
                    lines.setdefault(m[1], []).append(line)
        return {job: Parsable(rows.header, kept) for job, kept in lines.items()}
    out: dict[str, list[dict[str, str]]] = {}
    for row in rows:
        if m := _JOBID.match(row["JobID"]):
            out.setdefault(m[1], []).append(row)
    return {job: kept for job, kept in out.items()}


def submitted_since(rows: Sequence[dict[str, str]], floor: float) -> Sequence[dict[str, str]]:
    """A job's rows submitted at ``floor`` or later (a row without a Submit time is kept). Slurm gives a job id
    again once its counter starts over (a controller started without its state, or past MaxJobId), and accounting
    keeps the earlier job's rows under it: `sacct -j` lists both, and the old job's runs would be read as this
    job's."""
    since = datetime.fromtimestamp(floor).isoformat(timespec="seconds")  # sacct's form and zone: compared as text

    def kept(submit: str) -> bool:
        return not submit[:1].isdigit() or submit >= since

    if isinstance(rows, Parsable):
        if "Submit" not in rows.header:
            return rows
        lines = [line for submit, line in rows.column("Submit") if kept(submit)]
        return rows if len(lines) == len(rows.lines) else Parsable(rows.header, lines)
    return [row for row in rows if kept(row.get("Submit", ""))]


def digest(rows: Sequence[dict[str, str]]) -> str:
    """A job's sacct rows in a few bytes: equal digests, nothing new to fold in. A running row's ElapsedRaw (GROWS)
    is left out: it grows on every poll, and the ledger takes a run's elapsed time only once it has ended (which
    changes its End); kept in, every running job would be read and written again on every poll."""
    if isinstance(rows, Parsable):  # its text: the same whenever its rows are
        if rows.header[-1:] == [GROWS]:  # as FIELDS ask: the last column, cut off without splitting the line
            text = "\n".join(["|".join(rows.header[:-1]), *(line.rpartition("|")[0] for line in rows.lines)])
        else:
            text = "\n".join(
                [
                    "|".join(h for h in rows.header if h != GROWS),
                    *("|".join(v for h, v in zip(rows.header, line.split("|")) if h != GROWS) for line in rows.lines),
                ]
            )
    else:
        text = "\n".join("|".join(f"{k}={v}" for k, v in row.items() if k != GROWS) for row in rows)
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def histories(rows: Sequence[dict[str, str]]) -> dict[str, dict[int, TaskHistory]]:
    """sacct rows -> {base job id: {task index (-1: not an array): history}}.

    A pending-range row (``2_[6-11%3]``) stands for tasks that have not started; a task with a row of its
    own is left out of it: sacct can list a throttled array's task in both for a while after it starts.
    """
    rows = list(rows)  # read twice: parsed once
    out: dict[str, dict[int, TaskHistory]] = {}
    own = {m.groups() for m in map(_JOBID.match, (row["JobID"] for row in rows)) if m and m[2] and m[2][0] != "["}
    for row in rows:
        m = _JOBID.match(row["JobID"])
        if not m:
            continue  # a step such as 12.batch
        base, task = m.groups()
        tasks = (
            [-1]
            if task is None
            else (
                [t for t in expand_task_range(task) if (base, str(t)) not in own]
                if task.startswith("[")
                else [int(task)]
            )
        )
        gpus = _GPUS.search(row.get("AllocTRES", ""))
        attempt = Attempt(
            normal_state(row["State"]),
            parse_time(row.get("Submit", "")),
            parse_time(row.get("Start", "")),
            parse_time(row.get("End", "")),
            row.get("NodeList", ""),
            row.get("ExitCode", ""),
            int(gpus.group(1)) if gpus else 0,
            row.get("Reason", ""),
            int(row["ElapsedRaw"]) if row.get("ElapsedRaw", "").isdigit() else None,
        )
        for t in tasks:
            out.setdefault(base, {}).setdefault(t, TaskHistory()).attempts.append(attempt)
    for by_task in out.values():
        for h in by_task.values():
            h.attempts = merge_resized(sorted(h.attempts, key=lambda a: (a.submit or 0, a.start or float("inf"))))
    return out


def merge_resized(attempts: list[Attempt]) -> list[Attempt]:
    """Each RESIZING part joined to the part that follows it: one run from its first part's start, on the nodes
    and GPUs first allocated, its elapsed time and GPU-seconds summed. A last part still RESIZING is a run going on."""
    out: list[Attempt] = []
    part: Attempt | None = None
    for a in attempts:
        if part is not None:
            a = replace(
                a,
                start=part.start,
                node_list=part.node_list,
                gpus=part.gpus,
                elapsed_s=_sum(part.elapsed_s, a.elapsed_s),
                gpu_s=_sum(part.gpu_s, a.gpu_s),
            )
        part = a if a.state == "RESIZING" else None
        if part is None:
            out.append(a)
    if part is not None:
        out.append(replace(part, state="RUNNING", end=None, elapsed_s=None, gpu_s=None))
    return out


def _sum(a: _N | None, b: _N | None) -> _N | None:
    return None if a is None or b is None else a + b
