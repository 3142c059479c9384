"""GPU-hours and cost from Slurm's accounting: every attempt (requeued runs included) as sacct counts it
(AllocTRES gres/gpu x ElapsedRaw, kept in the ledger by each poll), priced per partition by the site.

Work lost to an interruption is the GPU time of a run after its last committed checkpoint (all of
it when it committed none) for runs that did not complete: the part a resumed run does again. Where the
trainer journaled its steps, each run's GPU time is also split by cause (`hpctrain.jobs.goodput`).

A window [since, now] counts each run's share of it: its GPU-hours spread evenly over its run time (a running
run's up to now). The runs of a job that has settled (ended, its journal read for the last time) are measured
once and kept in the ledger (`settle`, the ledger's run_usage), so that a month of a busy user's runs is summed
in SQL rather than measured again at each report.
"""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hpctrain.contract import UTILIZATION, JobPaths
from hpctrain.jobs.goodput import GPU_CAUSES, Goodput, job_goodput
from hpctrain.ledger.usage import MINUTE, sample

if TYPE_CHECKING:  # the CLI imports this module's names at start-up: no SQLite libraries then
    from hpctrain.ledger import Ledger
    from hpctrain.ledger.rows import RunFacts, SegmentRow

# Runs whose work after the last checkpoint is done again by the next run.
INTERRUPTED = ("preemption", "timeout", "node_failure", "requeued", "error", "oom")
SETTLE_BATCH = 2000  # jobs measured and kept per transaction
CURVE_POINTS = 400  # samples of each account's running total of GPU-hours in a report
TIMELINE_POINTS = 60  # a settled job's GPU timeline, at most, a task and node (hpctrain.ledger.gpus)
GPU_CURVES_KEPT_S = 40 * 86400  # and for how long after its first point


@dataclass(slots=True)  # a report reads tens of thousands
class Usage:
    """One run of a job or array task: whole (`measure`), or its part within a window (`windowed`)."""

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
    lost_from: float | None = None  # an interrupted run's last checkpoint (its start without one): work redone after


def settle(ledger: Ledger, site: str, now: float | None = None, limit: int | None = None) -> int:
    """Measure and keep the runs of the site's jobs (at most ``limit``) that have settled since the last call, and
    thin their GPU timelines; how many jobs."""
    from hpctrain.ledger.jobs import JOURNAL_SETTLE_S, JOURNALS_READ_S

    now = now or time.time()
    ids = ledger.usage.settleable(site, JOURNAL_SETTLE_S, now - JOURNALS_READ_S, limit)
    for i in range(0, len(ids), SETTLE_BATCH):
        part = ids[i : i + SETTLE_BATCH]
        runs = measure(ledger, ledger.attempts.usage_of(part, now), now)
        # The samplers' journals by the name their notes have (resolved): of the jobs sampled alone, before the
        # write transaction (on a shared file system each path is round trips to its server).
        journals = [
            os.path.realpath(JobPaths.journal_of(d)) for d in ledger.jobs.dirs(ledger.gpus.sampled(part)).values()
        ]
        with ledger.transaction():  # one decision: a job's runs kept, its GPU use packed, its samplers' notes gone
            ledger.usage.keep(part, [_kept_row(site, u) for u in runs], now)
            ledger.gpus.settle(part, TIMELINE_POINTS, now - GPU_CURVES_KEPT_S)
            ledger.ingested.forget(journals, UTILIZATION)
    return len(ids)


def measure(ledger: Ledger, rows: list[RunFacts], now: float) -> list[Usage]:
    """Runs (the ledger's usage rows, every run of each job) whole: sacct's GPU-seconds (GPUs x elapsed without
    them; a running run's up to ``now``) split by goodput cause, the queue time after them, unpriced."""
    segments: dict[int, list[SegmentRow]] = defaultdict(list)
    for seg in ledger.segments.of_jobs(r["job_id"] for r in rows) if rows else []:
        segments[seg["job_id"]].append(seg)
    runs_of: dict[int, list[RunFacts]] = defaultdict(list)
    for r in rows:
        runs_of[r["job_id"]].append(r)
    out = []
    for job_id, runs in runs_of.items():
        split = job_goodput(runs, segments[job_id], now)
        measured = {(s["task_index"], s["attempt"]) for s in segments[job_id]}
        for r in runs:
            key = (r["task_index"], r["attempt"])
            out.append(_whole(r, split[key], key in measured, now))
    return out


def _whole(r: RunFacts, good: Goodput, measured: bool, now: float) -> Usage:
    start, end, gpus = r["started_at"], r["ended_at"], r["gpus"] or 0
    if end is None:
        hours, spare = gpus * max(0.0, now - start) / 3600, 0.0
    else:
        seconds = r["elapsed_s"] if r["elapsed_s"] is not None else end - start
        hours = r["gpu_s"] / 3600 if r["gpu_s"] is not None else gpus * seconds / 3600
        spare = (r["idle_gpu_s"] or 0.0) / 3600  # spare nodes' GPUs while they waited: apart from the split
    run_s = sum(good.seconds.values())
    causes = {k: (hours - spare) * v / run_s if run_s else 0.0 for k, v in good.seconds.items()}
    causes["spare"] = spare
    lost_from = (r["last_checkpoint_at"] or start) if r["cause"] in INTERRUPTED and end is not None else None
    lost = gpus * max(0.0, end - lost_from) / 3600 if lost_from is not None and end is not None else 0.0
    return Usage(
        r["job_id"],
        r["task_index"],
        r["attempt"],
        r["name"],
        r["account"],
        r["user"],
        r["sweep_id"],
        r["partition"],
        gpus,
        start,
        end,
        r["cause"],
        hours,
        lost,
        0.0,
        causes,
        measured,
        good.queue_s,
        lost_from,
    )


def _kept_row(site: str, u: Usage) -> dict[str, Any]:
    """A settled run as a row of the ledger's run_usage."""
    return {
        "job_id": u.job_id,
        "task_index": u.task_index,
        "attempt": u.attempt,
        "site": site,
        "account": u.account,
        "partition": u.partition,
        "gpus": u.gpus,
        "started_at": u.started_at,
        "ended_at": u.ended_at,
        "cause": u.cause,
        "gpu_hours": u.gpu_hours,
        "lost_from": u.lost_from,
        "measured": int(u.measured),
        "queue_s": u.queue_s,
        **{f"{c}_h": u.causes.get(c, 0.0) for c in GPU_CAUSES},
    }


def _from_kept(r: dict[str, Any]) -> Usage:
    """A whole run from its run_usage row (with its job's name, user and sweep)."""
    return Usage(
        r["job_id"],
        r["task_index"],
        r["attempt"],
        r["name"],
        r["account"],
        r["user"],
        r["sweep_id"],
        r["partition"],
        r["gpus"],
        r["started_at"],
        r["ended_at"],
        r["cause"],
        r["gpu_hours"],
        0.0,
        0.0,
        {c: r[f"{c}_h"] for c in GPU_CAUSES},
        bool(r["measured"]),
        r["queue_s"],
        r["lost_from"],
    )


def windowed(u: Usage, since: float, now: float, prices: dict[str, float]) -> Usage:
    """A whole run cut, in place, to its part within [since, now] (its share of the run time; the ledger's run_usage
    sums do the same in SQL), with the work lost within the window, priced per partition."""
    end = u.ended_at if u.ended_at is not None else now
    share = (min(end, now) - max(u.started_at, since)) / (end - u.started_at) if end > u.started_at else 1.0
    if u.lost_from is not None:
        u.lost_gpu_hours = u.gpus * max(0.0, min(end, now) - max(u.lost_from, since)) / 3600
    if share != 1.0:  # most runs of a window lie wholly in it
        u.gpu_hours *= share
        u.causes = {k: share * v for k, v in u.causes.items()}
    u.cost = u.gpu_hours * prices.get(u.partition or "", 0.0)
    return u


def usage(
    ledger: Ledger,
    site: str,
    prices: dict[str, float],
    since: float | None = None,
    now: float | None = None,
    *,
    account: str | None = None,
    job_id: int | None = None,
    sweep_id: str | None = None,
) -> list[Usage]:
    """Every run of the site's jobs (of one account, job or sweep) that overlaps [since, now], its GPU-hours
    counted within that window, in order of start."""
    now, since = now or time.time(), since or 0.0
    settle(ledger, site, now)
    kept = [
        _from_kept(r) for r in ledger.usage.runs(site, since, now, account=account, job_id=job_id, sweep_id=sweep_id)
    ]
    live = measure(
        ledger,
        ledger.attempts.unsettled_usage(site, since, now, account=account, job_id=job_id, sweep_id=sweep_id),
        now,
    )
    return sorted((windowed(u, since, now, prices) for u in kept + live), key=lambda u: u.started_at)


def percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"


GROUPS = ("account", "user", "sweep", "job", "partition")


@dataclass(slots=True)
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
    idle_gpu_hours: float = 0.0  # GPUs held idle, as their samplers saw them (`add_idle`): across the causes

    @property
    def goodput(self) -> float | None:
        """Productive GPU time over the GPU time of the runs that say (None: no run does)."""
        return self.causes.get("productive", 0.0) / self.measured_gpu_hours if self.measured_gpu_hours else None

    def add(
        self,
        jobs: Iterable[int],
        runs: int,
        gpu_hours: float,
        lost_gpu_hours: float,
        cost: float,
        causes: dict[str, float],
        measured: bool,
        queue_s: float,
    ) -> None:
        """Runs (one, or a sum of several) into the total."""
        self.jobs.update(jobs)
        self.runs += runs
        self.gpu_hours += gpu_hours
        self.lost_gpu_hours += lost_gpu_hours
        self.cost += cost
        self.queue_s += queue_s
        if measured:
            self.measured_gpu_hours += gpu_hours
        if not self.causes:  # the first: most totals by job are of one job's sums
            self.causes = dict(causes)
            return
        mine = self.causes
        for cause, hours in causes.items():
            mine[cause] = mine.get(cause, 0.0) + hours

    def add_run(self, u: Usage) -> None:
        self.add((u.job_id,), 1, u.gpu_hours, u.lost_gpu_hours, u.cost, u.causes, u.measured, u.queue_s)


_KEYS = {"sweep": "sweep_id", "job": "job_id"}


def _key(by: str) -> str:
    """The attribute of a run (Usage) or column of a kept job's sums that a total per ``by`` (of GROUPS) sums by."""
    return _KEYS.get(by, by)


def totals(runs: Iterable[Usage], by: str, groups: dict[object, Total] | None = None) -> list[Total]:
    """Runs summed per account, user, sweep, job or partition (one of GROUPS) into ``groups``, largest first."""
    groups = {} if groups is None else groups
    attribute = _key(by)
    for u in runs:
        key = getattr(u, attribute)
        groups.setdefault(key, Total(key)).add_run(u)
    return sorted(groups.values(), key=lambda t: -t.gpu_hours)


def _kept_totals(
    groups: dict[object, Total], by: str, prices: dict[str, float], sums: Iterable[dict[str, Any]]
) -> float | None:
    """The ledger's sums of kept runs per ``by`` (`RunUsage.per_group`) added to ``groups``; the first moment
    within the window that any of them ran."""
    first = None
    for g in sums:
        groups.setdefault(g["key"], Total(g["key"])).add(
            map(int, g["jobs"].split(",")) if "," in g["jobs"] else (int(g["jobs"]),),
            g["runs"],
            g["gpu_hours"],
            g["lost_gpu_hours"],
            g["gpu_hours"] * prices.get(g["partition"] or "", 0.0),
            {c: g[c] for c in GPU_CAUSES},
            bool(g["measured"]),
            g["queue_s"],
        )
        first = g["first"] if first is None else min(first, g["first"])
    return first


def cost_totals(
    ledger: Ledger, site: str, prices: dict[str, float], by: str, since: float | None = None, now: float | None = None
) -> list[Total]:
    """`totals` of `usage` without a row per run: the settled runs summed by the ledger per job, the others
    measured here; memory follows the jobs in the window, not their runs."""
    now, since = now or time.time(), since or 0.0
    settle(ledger, site, now)
    groups: dict[object, Total] = {}
    _kept_totals(groups, by, prices, ledger.usage.per_group(site, since, now, _key(by)))
    live = measure(ledger, ledger.attempts.unsettled_usage(site, since, now), now)
    return totals((windowed(u, since, now, prices) for u in live), by, groups)


def add_idle(ledger: Ledger, groups: list[Total], since: float | None = None) -> None:
    """Each total's GPU-hours held idle (hpctrain.runtime.utilization: below `[idle] below_percent` for
    `after_minutes` or longer), from its jobs' GPU summaries sampled since ``since``; at most its GPU-hours (a
    sampler's clock counts the fraction of a second that Slurm's elapsed time, in whole seconds, leaves out)."""
    idle = ledger.gpus.idle_seconds({j for g in groups for j in g.jobs}, since or 0.0)
    for g in groups:
        g.idle_gpu_hours = min(sum(idle.get(j, 0.0) for j in g.jobs) / 3600, g.gpu_hours)


def pooled_goodput(groups: Iterable[Total]) -> float | None:
    """The goodput of the groups together (`overall(groups).goodput` without summing everything else)."""
    productive, measured = 0.0, 0.0
    for t in groups:
        productive += t.causes.get("productive", 0.0)
        measured += t.measured_gpu_hours
    return productive / measured if measured else None


def overall(groups: Iterable[Total]) -> Total:
    """The totals summed into one."""
    out = Total("all")
    for t in groups:
        out.add(t.jobs, t.runs, t.gpu_hours, t.lost_gpu_hours, t.cost, t.causes, False, t.queue_s)
        out.measured_gpu_hours += t.measured_gpu_hours
        out.idle_gpu_hours += t.idle_gpu_hours
    return out


@dataclass
class Summary:
    """The runs of a window as an account report shows them: totals per account (largest first), GPU-hours by cause
    per local day of the runs' start (runs whose trainer journals its steps), and each account's running total of
    GPU-hours at CURVE_POINTS + 1 evenly spaced times (exact there, each run's GPU-hours spread over its time)."""

    totals: list[Total]
    days: dict[str, dict[str, float]]
    curves: dict[str, tuple[list[float], list[float]]]


def summary(
    ledger: Ledger,
    site: str,
    prices: dict[str, float],
    since: float | None = None,
    now: float | None = None,
    account: str | None = None,
    points: int = CURVE_POINTS,
) -> Summary:
    """The window's Summary for one account (None: every account): the settled runs summed by the ledger, the
    others measured here."""
    now, since = now or time.time(), since or 0.0
    settle(ledger, site, now)
    live = [
        windowed(u, since, now, prices)
        for u in measure(ledger, ledger.attempts.unsettled_usage(site, since, now, account=account), now)
    ]
    groups: dict[object, Total] = {}
    first = _kept_totals(groups, "account", prices, ledger.usage.per_group(site, since, now, "account", account))
    days: dict[str, dict[str, float]] = {
        r["day"]: {c: r[c] for c in GPU_CAUSES} for r in ledger.usage.by_day(site, since, now, account)
    }
    for u in live:
        groups.setdefault(u.account, Total(u.account)).add_run(u)
        if u.measured:
            day = days.setdefault(
                datetime.fromtimestamp(u.started_at).strftime("%Y-%m-%d"), dict.fromkeys(GPU_CAUSES, 0.0)
            )
            for cause, hours in u.causes.items():
                day[cause] += hours
    firsts = ([] if first is None else [first]) + [max(u.started_at, since) for u in live]
    t0 = math.floor((since or min(firsts, default=now)) / MINUTE) * MINUTE  # samples at whole minutes
    return Summary(
        sorted(groups.values(), key=lambda t: -t.gpu_hours),
        dict(sorted(days.items())),
        _curves(
            ledger.usage.curve(site, since, now, t0, _width(t0, now, points), account) if firsts else [],
            live,
            since,
            now,
            t0,
            points,
        ),
    )


def _width(t0: float, now: float, points: int) -> float:
    """The time between two samples of a curve from t0 to now: whole minutes, so that minutes are sampled whole."""
    return max(math.ceil((now - t0) / points / MINUTE), 1) * MINUTE


def _curves(
    kept: list[dict[str, Any]], live: list[Usage], since: float, now: float, t0: float, points: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Each account's running total of GPU-hours at t0 + k * width (up to `now`, the last sample), from the ledger's
    sums per sample (`RunUsage.curve`) and the ``live`` runs (cut to the window): at t, the runs ended by t count
    whole, a run under way counts rate * (t - its start), summed as t * (sum of rates) - (sum of rate * start)."""
    width = _width(t0, now, points)
    points = max(math.ceil((now - t0) / width), 0)
    steps: dict[str, list[list[float]]] = defaultdict(lambda: [[0.0] * (points + 1) for _ in range(3)])

    def add(acct: str | None, k: int, rate: float, rate_at: float, hours: float) -> None:
        rates, rates_at, ended = steps[acct or "-"]
        k = min(k, points)
        rates[k] += rate
        rates_at[k] += rate_at
        ended[k] += hours

    for r in kept:
        add(r["account"], r["k"], r["rate"], r["rate_at"], r["hours"])
    for u in live:
        a, b = max(u.started_at, since), min(u.ended_at if u.ended_at is not None else now, now)
        rate = u.gpu_hours / (b - a) if b > a else 0.0
        add(u.account, sample(a, t0, width), rate, rate * (a - t0), 0.0)
        add(u.account, sample(b, t0, width), -rate, -rate * (a - t0), u.gpu_hours)
    out = {}
    for acct in sorted(steps):
        rate = rate_at = ended = 0.0
        times, hours = [], []
        for k, (dr, da, de) in enumerate(zip(*steps[acct])):
            rate, rate_at, ended = rate + dr, rate_at + da, ended + de
            t = min(t0 + k * width, now)
            times.append(t)
            hours.append(ended + rate * (t - t0) - rate_at)
        out[acct] = (times, hours)
    return out
