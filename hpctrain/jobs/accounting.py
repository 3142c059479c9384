"""GPU-hours and cost from Slurm's accounting: every attempt (requeued runs included) as sacct counts it
(AllocTRES gres/gpu x ElapsedRaw, kept in the ledger by each poll), priced per partition by the site.

Work lost to an interruption is the GPU time of a run after its last committed checkpoint (all of
it when it committed none) for runs that did not complete: the part a resumed run does again. Where the
trainer journaled its steps, each run's GPU time is also split by cause (`hpctrain.jobs.goodput`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI imports this module's names at start-up: no SQLite libraries then
    from hpctrain.ledger import Ledger

# Runs whose work after the last checkpoint is done again by the next run.
INTERRUPTED = ("preemption", "timeout", "node_failure", "requeued", "error", "oom")


@dataclass
class Usage:
    """One run of a job or array task, within the window asked for."""

    job_id: int
    task_index: int
    attempt: int
    name: str
    account: str | None
    user: str | None
    sweep_id: str | None
    partition: str | None
    gpus: int
    started_at: float
    ended_at: float | None
    cause: str | None
    gpu_hours: float
    lost_gpu_hours: float
    cost: float
    causes: dict[str, float] = field(default_factory=dict)  # GPU-hours by goodput cause; all "other" if unjournaled
    measured: bool = False  # the trainer journaled its job-step starts and steps
    queue_s: float = 0.0  # in the queue after this run, before the job's next run


def usage(ledger: "Ledger", site: str, prices: dict[str, float], since: float | None = None,
          now: float | None = None) -> list[Usage]:
    """Every run of the site's jobs that overlaps [since, now], its GPU-hours counted within that window."""
    from hpctrain.jobs.goodput import job_goodput

    now, since = now or time.time(), since or 0.0
    rows = ledger.attempts.usage(site, since, now)
    segments: dict[int, list[dict]] = {}
    for seg in ledger.segments.of_jobs(r["job_id"] for r in rows) if rows else []:
        segments.setdefault(seg["job_id"], []).append(seg)
    measured = {(s["job_id"], s["task_index"], s["attempt"]) for segs in segments.values() for s in segs}
    runs_of: dict[int, list[dict]] = {}
    for r in rows:
        runs_of.setdefault(r["job_id"], []).append(r)
    by_run = {}
    for job_id, runs in runs_of.items():
        for (task, attempt), good in job_goodput(runs, segments.get(job_id, []), now).items():
            by_run[(job_id, task, attempt)] = good
    out = []
    for r in rows:
        start, end = r["started_at"], r["ended_at"]
        # sacct's own seconds for a whole finished run; clock arithmetic for a running or clipped one.
        whole = end is not None and start >= since and r["elapsed_s"] is not None
        seconds = r["elapsed_s"] if whole else max(0.0, (end or now) - max(start, since))
        gpus = r["gpus"] or 0
        lost = 0.0
        if r["cause"] in INTERRUPTED and end is not None:
            lost = gpus * max(0.0, end - max(r["last_checkpoint_at"] or start, since)) / 3600
        # A resized run's parts each count their own GPUs (sacct); spare nodes' GPUs while they waited apart.
        hours = r["gpu_s"] / 3600 if whole and r["gpu_s"] is not None else gpus * seconds / 3600
        spare = (r["idle_gpu_s"] or 0.0) / 3600 if whole else 0.0
        key = (r["job_id"], r["task_index"], r["attempt"])
        good = by_run[key]
        run_s = sum(good.seconds.values())
        causes = {k: (hours - spare) * v / run_s if run_s else 0.0 for k, v in good.seconds.items()}
        causes["spare"] = spare
        out.append(Usage(r["job_id"], r["task_index"], r["attempt"], r["name"], r["account"], r["user"], r["sweep_id"],
                         r["partition"], gpus, start, end, r["cause"], hours, lost,
                         hours * prices.get(r["partition"] or "", 0.0), causes, key in measured, good.queue_s))
    return out


def goodput(runs: list[Usage]) -> float | None:
    """Productive GPU time over the GPU time of the runs whose trainer journals its steps (None: none does)."""
    measured = [u for u in runs if u.measured]
    hours = sum(u.gpu_hours for u in measured)
    return sum(u.causes.get("productive", 0.0) for u in measured) / hours if hours else None


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


GROUPS = ("account", "user", "sweep", "job", "partition")


@dataclass
class Total:
    key: object
    jobs: set[int] = field(default_factory=set)
    runs: int = 0
    gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    cost: float = 0.0
    causes: dict[str, float] = field(default_factory=dict)  # GPU-hours by goodput cause
    measured_gpu_hours: float = 0.0  # of runs whose trainer journaled its steps
    queue_s: float = 0.0

    @property
    def goodput(self) -> float | None:
        """Productive GPU time over the GPU time of the runs that say (None: no run does)."""
        return self.causes.get("productive", 0.0) / self.measured_gpu_hours if self.measured_gpu_hours else None


def totals(runs: list[Usage], by: str) -> list[Total]:
    """Runs summed per account, user, sweep, job or partition (one of GROUPS), largest first."""
    attr = {"sweep": "sweep_id", "job": "job_id"}.get(by, by)
    groups: dict[object, Total] = {}
    for u in runs:
        t = groups.setdefault(getattr(u, attr), Total(getattr(u, attr)))
        t.jobs.add(u.job_id)
        t.runs += 1
        t.gpu_hours += u.gpu_hours
        t.lost_gpu_hours += u.lost_gpu_hours
        t.cost += u.cost
        t.queue_s += u.queue_s
        if u.measured:
            t.measured_gpu_hours += u.gpu_hours
        for cause, hours in u.causes.items():
            t.causes[cause] = t.causes.get(cause, 0.0) + hours
    return sorted(groups.values(), key=lambda t: -t.gpu_hours)
