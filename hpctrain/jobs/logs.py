"""A job's logs, login side: its batch script's output (one file per Slurm id it ran under, per array task), a
mark where each run began (the offset `hpctrain attempt start` journals), one run's or one rank's lines (srun
--label), and following them while the job runs (one sacct per poll, as `status` does)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.contract import JobPaths
from hpctrain.jobs.poll import Poller, next_interval
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import TERMINAL

LABEL = re.compile(r"^(\d+): ", re.M)  # what srun --label puts before each line of a task


@dataclass(frozen=True)
class RunStart:
    """Where one run of a job (or of an array task) began in its log."""

    attempt: int
    log: str  # the log's file name in the job directory
    offset: int  # its size when the run began
    step: int | None  # the checkpoint the run resumed from
    time: float

    def mark(self) -> str:
        began = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.time))
        source = f"from checkpoint step {self.step}" if self.step else "from the start"
        return f"==> attempt {self.attempt} began {began}, {source} <=="


def run_starts(job_dir: Path, job_id: int) -> dict[int, list[RunStart]]:
    """Each task's runs (-1: a plain job's) as journaled by `hpctrain attempt start`, in order."""
    starts: dict[int, list[RunStart]] = {}
    for _, r in Journal(JobPaths(job_dir).journal_dir).records(["attempt_start"]):
        if r.get("job_id") == job_id and "log" in r:
            starts.setdefault(r["task_index"], []).append(
                RunStart(r["attempt"], r["log"], r["log_offset"], r.get("step"), r["time"])
            )
    return starts


@dataclass
class LogView:
    """One log file read bit by bit: a mark before each run's first line, only run ``attempt``'s and rank
    ``rank``'s lines if given."""

    path: Path
    task: int = -1
    attempt: int | None = None
    rank: int | None = None
    pos: int = 0
    current: int | None = None  # the run whose lines come next
    marked: set[int] = field(default_factory=set)

    def read(self, starts: list[RunStart], final: bool = True) -> list[str]:
        """The lines written since the last read (only whole lines unless ``final``)."""
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.pos)
                data = fh.read()
        except FileNotFoundError:
            data = b""
        if not final:
            data = data[: data.rfind(b"\n") + 1]
        end = self.pos + len(data)
        # A run journaled after its first lines were read (while following) is marked where the reading is.
        due = sorted(
            (s for s in starts if s.log == self.path.name and s.attempt not in self.marked and s.offset <= end),
            key=lambda s: (s.offset, s.attempt),
        )
        lines: list[str] = []
        cut = self.pos
        for run in due:
            at = max(run.offset, self.pos)
            lines += self._lines(data[cut - self.pos : at - self.pos])
            cut, self.current = at, run.attempt
            self.marked.add(run.attempt)
            if self.attempt in (None, run.attempt):
                lines.append(run.mark())
        lines += self._lines(data[cut - self.pos :])
        self.pos = end
        return lines

    def _lines(self, data: bytes) -> list[str]:
        if self.attempt is not None and self.current != self.attempt:
            return []
        lines = data.decode(errors="replace").splitlines()
        if self.rank is None:
            return lines
        return [ln for ln in lines if (m := LABEL.match(ln)) and int(m[1]) == self.rank]


def log_views(
    ledger: Ledger, job: dict[str, Any], task: int | None = None, attempt: int | None = None, rank: int | None = None
) -> list[LogView]:
    """The job's logs: a plain job's, one per Slurm id it ran under (oldest first); an array's, one per task
    (only ``task``'s if given)."""
    paths = JobPaths(Path(job["job_dir"]))
    if job["is_array"]:
        tasks = [task] if task is not None else [t["task_index"] for t in ledger.jobs.tasks(job["id"])]
        return [LogView(paths.output(job["slurm_job_id"], t), t, attempt, rank) for t in tasks]
    return [LogView(p, -1, attempt, rank) for p in paths.outputs()]


def show_logs(
    ledger: Ledger,
    client: SlurmClient,
    site: str,
    job: dict[str, Any],
    emit: Callable[[str], None],
    task: int | None = None,
    attempt: int | None = None,
    rank: int | None = None,
    follow: bool = False,
) -> None:
    """Emit the job's log lines (with a "==> task N: file <==" header per file of an array); with ``follow``,
    go on as they are written until the job has finished."""
    poller, interval = Poller(ledger, client, site), 1.0
    views: list[LogView] = []
    header = None
    while True:
        if follow:
            poller.refresh()
        finished = not follow or ledger.jobs.known(job["id"])["state"] in TERMINAL
        # A plain job run again under a new Slurm id writes a new file, also while it is followed.
        known = {v.path for v in views}
        views += [v for v in log_views(ledger, job, task, attempt, rank) if v.path not in known]
        starts = run_starts(Path(job["job_dir"]), job["id"])
        wrote = False
        for view in views:
            lines = view.read(starts.get(view.task, []), final=finished)
            if lines and job["is_array"] and header != view.path:
                emit(f"==> task {view.task}: {view.path} <==")
                header = view.path
            for line in lines:
                emit(line)
            wrote = wrote or bool(lines)
        if finished:
            return
        interval = next_interval(interval, 1.0, 10.0, wrote)
        time.sleep(interval)
