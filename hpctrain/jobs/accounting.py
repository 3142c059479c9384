"""GPU-hours and cost from Slurm's accounting: every attempt (requeued runs included) as sacct counts it
(AllocTRES gres/gpu x ElapsedRaw, kept in the ledger by each poll), priced per partition by the site.

Work lost to an interruption is the GPU time of a run after its last committed checkpoint (all of
it when it committed none) for runs that did not complete: the part a resumed run does again.
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


def usage(ledger: "Ledger", site: str, prices: dict[str, float], since: float | None = None,
          now: float | None = None) -> list[Usage]:
    """Every run of the site's jobs that overlaps [since, now], its GPU-hours counted within that window."""
    now, since = now or time.time(), since or 0.0
    out = []
    for r in ledger.attempts.usage(site, since, now):
        start, end = r["started_at"], r["ended_at"]
        # sacct's own seconds for a whole finished run; clock arithmetic for a running or clipped one.
        whole = end is not None and start >= since and r["elapsed_s"] is not None
        seconds = r["elapsed_s"] if whole else max(0.0, (end or now) - max(start, since))
        gpus = r["gpus"] or 0
        lost = 0.0
        if r["cause"] in INTERRUPTED and end is not None:
            lost = gpus * max(0.0, end - max(r["last_checkpoint_at"] or start, since)) / 3600
        hours = gpus * seconds / 3600
        out.append(Usage(r["job_id"], r["task_index"], r["attempt"], r["name"], r["account"], r["user"], r["sweep_id"],
                         r["partition"], gpus, start, end, r["cause"], hours, lost,
                         hours * prices.get(r["partition"] or "", 0.0)))
    return out


GROUPS = ("account", "user", "sweep", "job", "partition")


@dataclass
class Total:
    key: object
    jobs: set[int] = field(default_factory=set)
    runs: int = 0
    gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    cost: float = 0.0


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
    return sorted(groups.values(), key=lambda t: -t.gpu_hours)
