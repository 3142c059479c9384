"""The run_usage and job_usage tables: each run's GPU-hours whole and by goodput cause, kept once its job has settled
(ended, its journal read for the last time), each job's sums of them, and the sums that cost and reports take.

A window [since, now] counts a kept run's share of it: its GPU-hours spread evenly over its run time. Work lost
to an interruption (the run's time after ``lost_from``, its last checkpoint) is counted within the window.
Schema v11's trigger drops a job's rows when its end changes (requeued, resubmitted): it settles again later.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.schema import CAUSES, JOB_USAGE_FROM_RUNS

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

COLUMNS = (
    "job_id",
    "task_index",
    "attempt",
    "site",
    "account",
    "partition",
    "gpus",
    "started_at",
    "ended_at",
    "cause",
    "gpu_hours",
    "lost_from",
    "measured",
    "queue_s",
    *(f"{c}_h" for c in CAUSES),
)

_WINDOW = "site = :site AND ended_at >= :since AND started_at <= :now AND (:account IS NULL OR account = :account)"
# The window's share of a run, and the GPU-hours lost within the window (hpctrain.jobs.accounting.windowed).
_SHARE = (
    "CASE WHEN ended_at > started_at THEN (min(ended_at, :now) - max(started_at, :since)) / (ended_at - started_at) "
    "ELSE 1.0 END"
)
_LOST = (
    "CASE WHEN lost_from IS NULL THEN 0.0 ELSE gpus * max(0.0, min(ended_at, :now) - max(lost_from, :since)) / 3600 END"
)
_IN_WINDOW = f"SELECT *, {_SHARE} AS share, {_LOST} AS lost FROM run_usage WHERE {_WINDOW}"
# The runs of jobs already chosen, by its primary key: without statistics SQLite would read the window's runs instead.
_BY_JOB = "INDEXED BY sqlite_autoindex_run_usage_1"
_CAUSE_SUMS = ", ".join(f"sum(share * {c}_h) AS {c}" for c in CAUSES)

# Per job (and partition and measured): a window of runs comes out as one row per job, its user and sweep with it.
# A job that ran wholly inside the window is its job_usage row; the others (a run across an edge of the window, or
# runs of several accounts, partitions or kinds) are summed from their runs.
_JOBS_IN_WINDOW = (
    "SELECT * FROM job_usage WHERE site = :site AND ended_at >= :since AND started_at <= :now "
    "AND (:account IS NULL OR account = :account)"
)
_INSIDE = "uniform AND started_at >= :since AND ended_at <= :now AND (lost_from IS NULL OR lost_from >= :since)"
_PER_JOB_SQL = f"""
WITH w AS MATERIALIZED ({_JOBS_IN_WINDOW})
SELECT job_id, account, partition, measured, runs, gpu_hours, lost_gpu_hours, queue_s,
       started_at AS first, {", ".join(f"{c}_h AS {c}" for c in CAUSES)}, user, sweep_id
FROM w WHERE {_INSIDE}
UNION ALL
SELECT g.*, j.user, j.sweep_id FROM (
    SELECT job_id, account, partition, measured, count(*) AS runs, sum(share * gpu_hours) AS gpu_hours,
           sum(lost) AS lost_gpu_hours, sum(queue_s) AS queue_s, min(max(started_at, :since)) AS first, {_CAUSE_SUMS}
    FROM ({_IN_WINDOW.replace("FROM run_usage", f"FROM run_usage {_BY_JOB}")} AND job_id IN (SELECT job_id FROM w WHERE NOT ({_INSIDE})))
    GROUP BY job_id, partition, measured) g
JOIN jobs j ON j.id = g.job_id
"""
# Per group of jobs (by one of GROUP_KEYS, and partition and measured), the jobs' ids in a list.
_PER_GROUP_SQL = f"""
SELECT {{key}} AS key, partition, measured, group_concat(job_id) AS jobs, sum(runs) AS runs,
       sum(gpu_hours) AS gpu_hours, sum(lost_gpu_hours) AS lost_gpu_hours, sum(queue_s) AS queue_s,
       min(first) AS first, {", ".join(f"sum({c}) AS {c}" for c in CAUSES)}
FROM ({_PER_JOB_SQL}) GROUP BY 1, 2, 3
"""
GROUP_KEYS = ("account", "partition", "user", "sweep_id", "job_id")
_DAYS_SQL = f"""
SELECT date(started_at, 'unixepoch', 'localtime') AS day, {_CAUSE_SUMS}
FROM ({_IN_WINDOW}) WHERE measured GROUP BY day ORDER BY day
"""
MINUTE = 60.0  # usage_minutes holds kept runs by the minute ((m - 1) * MINUTE, m * MINUTE] of their start and end
_MINUTES_SQL = """
SELECT account, minute, started_rate, started_rate_off, ended_rate, ended_rate_off, ended_hours FROM usage_minutes
WHERE site = :site AND minute BETWEEN :first AND :last AND (:account IS NULL OR account = :account)
"""
# Kept runs the minutes in [first, last] do not count as they count in the window: runs begun by the window's start
# that end after the first minute's start, and runs that end after the last minute (found through their jobs).
_OUTSIDE_MINUTES_SQL = f"""
SELECT u.account, u.started_at, u.ended_at, u.gpu_hours FROM run_usage AS u {_BY_JOB}
WHERE u.job_id IN (SELECT job_id FROM job_usage WHERE site = :site AND ended_at > :low
                   AND (started_at <= :since OR ended_at > :high))
  AND u.site = :site AND (:account IS NULL OR u.account = :account)
  AND ((u.started_at <= :since AND u.ended_at > :low) OR (u.ended_at > :high AND u.started_at <= :now))
"""
_SETTLEABLE_SQL = """
SELECT id FROM jobs INDEXED BY jobs_usage_unsettled
WHERE site = :site AND usage_settled_at IS NULL AND ended_at IS NOT NULL
  AND (ended_at < :final_before OR job_dir IS NULL OR journal_read_at >= ended_at + :settle_s)
LIMIT :limit
"""
# Kept runs with their job's name, user and sweep: of a window, or of one job or sweep through the jobs' keys, so
# that `compare` and `report JOB` read the job's runs and not the year's.
_RUNS_SQL = """
SELECT u.*, j.name, j.user, j.sweep_id FROM {of}
u.site = :site AND u.ended_at >= :since AND u.started_at <= :now AND (:account IS NULL OR u.account = :account)
ORDER BY u.started_at
"""
_RUNS_OF = {
    "window": "run_usage u JOIN jobs j ON j.id = u.job_id WHERE",
    "job": f"run_usage u {_BY_JOB} JOIN jobs j ON j.id = u.job_id WHERE u.job_id = :job_id AND",
    "sweep": f"jobs j INDEXED BY jobs_sweep CROSS JOIN run_usage u {_BY_JOB} ON u.job_id = j.id "
    "WHERE j.sweep_id = :sweep_id AND",
}


class RunUsage:
    """Rows of `run_usage`, keyed by (job id, task index, run number)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger

    def settleable(self, site: str, settle_s: float, final_before: float, limit: int | None = None) -> list[int]:
        """Jobs of the site (at most ``limit``) whose runs are not kept yet but will not change: ended, and their
        journal read ``settle_s`` after the end (or none to read, or ended before ``final_before``, when journals
        are read no more)."""
        return [
            r[0]
            for r in self.ledger.db.execute(
                _SETTLEABLE_SQL,
                {
                    "site": site,
                    "settle_s": settle_s,
                    "final_before": final_before,
                    "limit": -1 if limit is None else limit,
                },
            )
        ]

    def settled(self, job_id: int) -> bool:
        """Whether the job's runs are kept (its GPU use packed): until it is reopened, its journal adds nothing."""
        row = self.ledger.db.execute("SELECT usage_settled_at FROM jobs WHERE id = ?", [job_id]).fetchone()
        return row is not None and row[0] is not None

    def keep(self, job_ids: Collection[int], runs: list[dict[str, Any]], at: float) -> None:
        """The runs (rows of COLUMNS) of these jobs, which have settled at ``at``."""
        ids = list(job_ids)
        parts = [(part, ",".join("?" * len(part))) for part in (ids[i : i + 500] for i in range(0, len(ids), 500))]
        with self.ledger.transaction() as db:
            for part, marks in parts:  # runs kept before are replaced: deleting them takes back their minutes
                db.execute(f"DELETE FROM run_usage WHERE job_id IN ({marks})", part)
            db.conn.executemany(
                f"INSERT INTO run_usage ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                [[r[c] for c in COLUMNS] for r in runs],
            )
            for part, marks in parts:
                db.execute(f"UPDATE jobs SET usage_settled_at = ? WHERE id IN ({marks})", [at, *part])
                db.execute(JOB_USAGE_FROM_RUNS.format(jobs=marks), part)

    def runs(
        self,
        site: str,
        since: float,
        now: float,
        *,
        account: str | None = None,
        job_id: int | None = None,
        sweep_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Kept runs (whole) overlapping [since, now], of one account, job or sweep, with their job's name, user and
        sweep, in order of start."""
        args = _args(site, since, now, account, job_id=job_id, sweep_id=sweep_id)
        return [dict(r) for r in self.ledger.db.query(_RUNS_SQL.format(of=_RUNS_OF[scope(job_id, sweep_id)]), args)]

    def per_group(
        self, site: str, since: float, now: float, key: str, account: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """Kept runs in [since, now] summed per (``key`` (one of GROUP_KEYS), partition, measured), streamed: the
        key, the ids of the jobs (``jobs``, comma-separated), runs, GPU-hours, lost GPU-hours, queue seconds,
        GPU-hours per cause (CAUSES), and the ``first`` moment within the window any of them ran. The ledger sums
        the runs: a row per group, not per run or job."""
        if key not in GROUP_KEYS:
            raise ValueError(f"cannot sum kept runs by {key!r}: one of {', '.join(GROUP_KEYS)}")
        cursor = self.ledger.db.execute(_PER_GROUP_SQL.format(key=key), _args(site, since, now, account))
        columns = [c[0] for c in cursor.description]
        return (dict(zip(columns, r, strict=True)) for r in cursor)

    def by_day(self, site: str, since: float, now: float, account: str | None = None) -> list[dict[str, Any]]:
        """GPU-hours per cause of the kept runs in [since, now] whose trainer journals its steps, per local day of
        their start, in order of day."""
        return [dict(r) for r in self.ledger.db.query(_DAYS_SQL, _args(site, since, now, account))]

    def curve(
        self, site: str, since: float, now: float, t0: float, width: float, account: str | None = None
    ) -> list[dict[str, Any]]:
        """The kept runs' GPU-hours in [since, now] as a running total per account sampled at t0 + k * width (whole
        minutes, see `sample`): per (account, k), the change in the rate of GPU-hours per second, in that rate
        times (start - t0), and the GPU-hours of the runs that ended, from sample k on (``hpctrain.jobs.accounting``
        sums them up). Runs wholly within the window's whole minutes are read as minutes (usage_minutes); those
        across its edges run by run."""
        first, last = math.floor(since / MINUTE) + 1, math.floor(now / MINUTE)
        low, high = (first - 1) * MINUTE, last * MINUTE
        sums: dict[tuple[str | None, int], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])

        def add(acct: str | None, x: float, rate: float, rate_at: float, hours: float) -> None:
            got = sums[(acct, sample(x, t0, width))]
            got[0] += rate
            got[1] += rate_at
            got[2] += hours

        args = {"site": site, "first": first, "last": last, "account": account}
        for acct, m, s_rate, s_off, e_rate, e_off, e_hours in self.ledger.db.execute(_MINUTES_SQL, args):
            at = m * MINUTE
            add(acct or None, at, s_rate - e_rate, s_off - e_off + (s_rate - e_rate) * (at - t0), e_hours)
        outside = {"site": site, "since": since, "now": now, "low": low, "high": high, "account": account}
        for acct, a0, b0, gpu_hours in self.ledger.db.execute(_OUTSIDE_MINUTES_SQL, outside):
            rate = gpu_hours / (b0 - a0) if b0 > a0 else 0.0
            if first <= (m := math.ceil(a0 / MINUTE)) <= last:  # counted at its start's minute: taken back
                add(acct, m * MINUTE, -rate, -rate * (a0 - t0), 0.0)
            if first <= (m := math.ceil(b0 / MINUTE)) <= last:  # counted at its end's minute: taken back
                add(acct, m * MINUTE, rate, rate * (a0 - t0), -gpu_hours)
            if b0 >= since and a0 <= now:  # its share of the window, as `windowed` cuts a run
                a, b = max(a0, since), min(b0, now)
                add(acct, a, rate, rate * (a - t0), 0.0)
                add(acct, b, -rate, -rate * (a - t0), gpu_hours * ((b - a) / (b0 - a0) if b0 > a0 else 1.0))
        return [
            {"account": acct, "k": k, "rate": v[0], "rate_at": v[1], "hours": v[2]} for (acct, k), v in sums.items()
        ]


def scope(job_id: int | None, sweep_id: str | None) -> str:
    """Which runs a query of usage asks for, each read through its own index: "job", "sweep" or "window"."""
    if job_id is not None and sweep_id is not None:
        raise ValueError("the runs of a job or of a sweep, not both")
    return "job" if job_id is not None else "sweep" if sweep_id is not None else "window"


def sample(x: float, t0: float, width: float) -> int:
    """The first sample of a curve at t0 + k * width at or after ``x``. With t0 and width whole minutes, every
    moment of a minute ((m - 1) * MINUTE, m * MINUTE] has the same."""
    return max(0, math.ceil((x - t0) / width))


def _args(site: str, since: float, now: float, account: str | None, **more: Any) -> dict[str, Any]:
    return {"site": site, "since": since, "now": now, "account": account, **more}
