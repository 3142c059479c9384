"""A heavy user's year (issue 41), generated straight into SQLite: many runs per job (preemptions, retries, runs
cancelled before they started), a few thousand active jobs among them big arrays split past MaxArraySize with tens
of thousands of active tasks, heavy-tailed metrics (a few jobs of hundreds of thousands of points); and a Slurm that
answers for the active jobs as the ledger has them (benchmarks/ledger_scale.py --heavy)."""

from __future__ import annotations

import datetime
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.jobs.accounting import settle
from hpctrain.ledger import Ledger

from helpers.ledger import ACCOUNTS, COLUMNS, DAY, ENDED, SITE, QuietSlurm, insert, spec_of

MAX_ARRAY = 1000  # tasks of one array job: a submission of more is split in parts, one group
BIG_ARRAYS = 8  # active submissions of ACTIVE_TASKS // BIG_ARRAYS tasks each
LONG_JOBS = (500_000, 200_000, 100_000)  # points of the longest jobs' metrics (the newest ended jobs)


def make_heavy_history(path: Path, jobs: int, now: float, days: float = 365, active: int = 2000,
                       active_tasks: int = 24_000, seed: int = 0) -> dict[str, int]:
    """``jobs`` job rows over the ``days`` before ``now``: 60 % plain (1 to 40 runs each, 1 in 12 cancelled before
    it started), 25 % arrays of heavy-tailed size, 15 % sweeps of 20 trials; the newest ``active`` still active,
    among them BIG_ARRAYS submissions of ``active_tasks`` tasks in all and ACTIVE_SWEEPS sweeps; 1,000 loss points for one plain job in 50
    and LONG_JOBS points for three of the newest ended ones; one ended sweep of MAX_ARRAY trials, BIG_SWEEP_POINTS
    points each. Settled as reconcile would have, without planner statistics. Returns the ids to time: the longest
    job, the first part of an active big array, and the big sweep's job (its sweep: ``sweep-<id>``)."""
    rnd = random.Random(seed)
    first_at = now - days * DAY
    rows: dict[str, list[tuple]] = {table: [] for table in COLUMNS}
    jid = 0
    long_jobs = {jobs - active - 1 - k: n for k, n in enumerate(LONG_JOBS)}
    big_sweep = jobs - active - 1 - len(LONG_JOBS)
    per_array = active_tasks // BIG_ARRAYS
    big = set(range(jobs - active, jobs - active + BIG_ARRAYS))
    sweeping = set(range(jobs - active + BIG_ARRAYS, jobs - active + BIG_ARRAYS + ACTIVE_SWEEPS))
    picked: dict[str, int] = {}
    with Ledger(path) as ledger:
        db = ledger.db.conn
        for i in range(jobs):
            submitted = first_at + i * (now - first_at) / jobs
            live = i >= jobs - active
            if i in big:
                group = jid + 1
                picked.setdefault("big_array", group)
                for start in range(0, per_array, MAX_ARRAY):
                    jid += 1
                    _array(rows, rnd, jid, group, submitted, min(MAX_ARRAY, per_array - start), live=True)
            elif i in sweeping:
                jid += 1
                _array(rows, rnd, jid, jid, submitted, TRIALS, live=True, sweep=True)
            elif i == big_sweep:
                jid += 1
                picked["big_sweep"] = jid
                _array(rows, rnd, jid, jid, submitted, MAX_ARRAY, live=False, sweep=True, points=BIG_SWEEP_POINTS)
            else:
                jid += 1
                kind = 0.0 if i in long_jobs else rnd.random()
                if kind < 0.6:
                    _plain(rows, rnd, jid, submitted, live, long_jobs.get(i, 1000 if rnd.random() < 0.02 else 0))
                    if long_jobs.get(i) == max(LONG_JOBS):
                        picked["long_job"] = jid
                else:
                    size = TRIALS if kind >= 0.85 else min(int(rnd.paretovariate(1.1) * 3), MAX_ARRAY)
                    _array(rows, rnd, jid, jid, submitted, size, live, sweep=kind >= 0.85 and not live)
            if len(rows["jobs"]) >= 20_000 or i == jobs - 1:
                insert(db, rows)
                rows = {table: [] for table in COLUMNS}
        settle(ledger, SITE, now)
        db.execute("DROP TABLE IF EXISTS sqlite_stat1")  # as users' ledgers were
        db.commit()
    return picked


def add_gpu_use(path: Path, now: float, seed: int = 0) -> int:
    """The GPU use of the heavy ledger's runs that started, as node samplers (issue 61) would have left it: each
    active run's 8 GPUs' rows (4 on each of its 2 nodes), each settled run's packed a row a node, and the curves of
    the settled runs of the last GPU_CURVES_KEPT_S (a row a task and node, a point a minute up to TIMELINE_POINTS).
    Packed rows are drawn from a pool of GPU_POOL made by hpctrain's own packing (81 M GPU-runs packed one by one
    take an hour). How many runs."""
    from hpctrain.jobs.accounting import GPU_CURVES_KEPT_S, TIMELINE_POINTS
    from hpctrain.ledger.gpus import packed_curve, packed_run

    rnd = random.Random(seed)
    runs_pool = [packed_run([_gpu_row(rnd, 0, -1, 0, "n1", str(d), 3600.0, now) for d in range(4)])
                 for _ in range(GPU_POOL)]
    curves_pool = {points: [packed_curve((0, -1, "n1"), [(60.0 * m, *_minute(rnd)) for m in range(points)], points)
                            for _ in range(GPU_POOL // 10)] for points in range(1, TIMELINE_POINTS + 1)}
    count = 0
    with Ledger(path) as ledger:
        db = ledger.db.conn
        runs = db.execute(
            "SELECT a.job_id, a.task_index, a.attempt, a.started_at, coalesce(a.ended_at, ?), j.usage_settled_at "
            "FROM attempts a JOIN jobs j ON j.id = a.job_id WHERE a.started_at IS NOT NULL AND a.alloc_gpus > 0 "
            "ORDER BY a.job_id, a.task_index, a.attempt",
            [now],
        )
        packed: list[tuple] = []
        live: list[dict[str, Any]] = []
        curves: dict[tuple[int, int, str], tuple] = {}
        for job_id, task, attempt, start, end, settled in runs:
            count += 1
            seconds = max(end - start, 1.0)
            for node in ("n1", "n2"):
                if settled is None:
                    live += [_gpu_row(rnd, job_id, task, attempt, node, str(d), seconds, end) for d in range(4)]
                    continue
                pooled = rnd.choice(runs_pool)
                idle = pooled[11] * seconds / 3600.0
                packed.append((job_id, task, attempt, 0, node, *pooled[5:7], end, *pooled[8:11], idle, *pooled[12:]))
                if start >= now - GPU_CURVES_KEPT_S:  # a task's runs on a node share its curve: the last one's
                    points = min(int(seconds // 60) + 1, TIMELINE_POINTS)
                    curves[job_id, task, node] = (job_id, task, node, start, *rnd.choice(curves_pool[points])[4:])
            if len(packed) >= 200_000:
                _insert_gpu_use(db, packed, list(curves.values()), live)
                packed, curves, live = [], {}, []
        _insert_gpu_use(db, packed, list(curves.values()), live)
        db.commit()
    return count


GPU_POOL = 1000


def _minute(rnd: random.Random) -> tuple[str, str]:
    """A timeline row's 4 GPUs: their percents and MiB, as JSON."""
    return (json.dumps({str(d): rnd.randint(0, 100) for d in range(4)}),
            json.dumps({str(d): rnd.randint(1000, 80_000) for d in range(4)}))


def _gpu_row(rnd: random.Random, job_id: int, task: int, attempt: int, node: str, device: str, seconds: float,
             at: float) -> dict[str, Any]:
    mean = rnd.uniform(0, 100)
    idle = seconds if mean < 5 else 0.0
    return {"job_id": job_id, "task_index": task, "attempt": attempt, "step_restart": 0, "node": node,
            "device": device, "kind": "nvml", "samples": int(seconds // 5), "seconds": seconds, "mean": mean,
            "p10": max(0.0, mean - 20), "mem_peak": rnd.uniform(1e9, 8e10), "mem_total": 8.5e10,
            "energy_j": 300.0 * seconds, "idle_s": idle, "idle_now_s": idle, "below_percent": 5.0, "after_s": 60.0,
            "alert_s": 600.0, "at": at, "final": 1}


def _insert_gpu_use(db, packed: list[tuple], curves: list[tuple], live: list[dict[str, Any]]) -> None:
    db.executemany("INSERT OR REPLACE INTO gpu_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", packed)
    db.executemany("INSERT OR REPLACE INTO gpu_curves VALUES (?, ?, ?, ?, ?, ?)", curves)
    if live:
        columns = list(live[0])
        db.executemany(f"INSERT OR REPLACE INTO gpu_use ({', '.join(columns)}) VALUES "
                       f"({', '.join(':' + c for c in columns)})", live)


TRIALS = 20
BIG_SWEEP_POINTS = 100  # loss points of each of the big sweep's trials
ACTIVE_SWEEPS = 3  # of TRIALS trials each, all of them in flight (max_parallel): a tick submits nothing
# An active sweep's spec as `hpctrain sweep` registers it (hpctrain.sweep.store).
SWEEP_SPEC = {"method": "random", "search": {"lr": {"type": "loguniform", "low": 1e-4, "high": 1e-3}}, "metric": "loss",
              "direction": "minimize", "max_trials": TRIALS, "max_parallel": TRIALS, "job": "train.toml"}


def _job(rows, jid: int, group: int, submitted: float, state: str, started: float | None, ended: float | None,
         is_array: bool, sweep_id: str | None = None) -> None:
    rows["jobs"].append((jid, f"job-{jid % 997}", SITE, "alice", ACCOUNTS[jid % 2], "gpu", "normal", str(10_000 + jid),
                         int(is_array), state, submitted, started, ended, spec_of(f"job-{jid % 997}", jid), group,
                         f"/shared/logs/job-{jid}", sweep_id, submitted, None if ended is None else ended + 300))
    rows["events"].append((submitted, "submitted", jid, f"slurm job {10_000 + jid}"))


def _run(rows, jid: int, task: int, n: int, state: str, start: float | None, end: float | None, last: bool,
         live: bool) -> None:
    decided = None if live and last else (0 if last else 1)
    rows["attempts"].append((jid, task, n, str(10_000 + jid) + (f"_{task}" if task >= 0 else ""), state,
                             None if start is None else "n[1-2]", start, end, "0:0", 8,
                             None if start is None or end is None else int(end - start),
                             None if end is None else ("preemption" if not last else state.lower()), decided,
                             None if decided is None else "-"))


def _plain(rows, rnd: random.Random, jid: int, submitted: float, live: bool, points: int) -> None:
    runs = 1 + min(int(rnd.expovariate(0.25)), 39)
    if not live and rnd.random() < 1 / 12:  # cancelled while it waited: sacct lists a run that never started
        _job(rows, jid, jid, submitted, "CANCELLED", None, submitted + 600, False)
        rows["attempts"].append((jid, -1, 0, str(10_000 + jid), "CANCELLED", None, None, submitted + 600, "0:0", 0, 0,
                                 "cancelled", None, None))
        return
    state = rnd.choice(("RUNNING", "PENDING")) if live else rnd.choice(ENDED)
    started = submitted + 60
    span = rnd.uniform(600, 4 * 3600) * runs
    ended = None if live else started + span
    for n in range(runs):
        last = n == runs - 1
        a, b = started + n * span / runs, started + (n + 1) * span / runs
        if last and live and state == "PENDING":
            _run(rows, jid, -1, n, "PENDING", None, None, True, True)
        else:
            _run(rows, jid, -1, n, (state if last else "PREEMPTED"), a, None if last and live else b, last, live)
    _job(rows, jid, jid, submitted, state, started, ended, False)
    for k in (1, 2):
        rows["checkpoints"].append((jid, 500 * k, f"/lustre/ckpt/job-{jid}/step_{500 * k:08d}",
                                    "committed" if k == 2 else "deleted", started + k * 300, 2 << 30))
    if points:
        rows["segments"].append((jid, -1, runs - 1, 0, started, started + 30, 0, None, points, 900.0, points,
                                 started + 930, 0))
        rows["metrics"] += [(jid, -1, "loss", s, 5.5 / (1 + s / 100), 0, started + 30 + s)
                            for s in range(1, points + 1)]


def _array(rows, rnd: random.Random, jid: int, group: int, submitted: float, size: int, live: bool,
           sweep: bool = False, points: int = 0) -> None:
    size = max(size, 1)
    started = submitted + 60
    ended = None if live else started + rnd.uniform(600, 4 * 3600)
    sweep_id = f"sweep-{jid}" if sweep else None
    if sweep_id:
        spec = json.dumps({"sweep": {**SWEEP_SPEC, "name": sweep_id}, "job": {"name": "trial", "command": ["true"]}})
        rows["sweeps"].append((sweep_id, sweep_id, "random", "ACTIVE" if live else "DONE", spec, submitted, ended))
    live_states = ("RUNNING",) if sweep else rnd.choices(("RUNNING", "PENDING", "COMPLETED"), (3, 6, 1), k=size)
    states = [(live_states[t % len(live_states)] if live else rnd.choice(ENDED)) for t in range(size)]
    for t, state in enumerate(states):
        rows["array_tasks"].append((jid, t, t, "{}", state, ended))
        if sweep_id:
            rows["trials"].append((sweep_id, t, json.dumps({"lr": rnd.uniform(1e-4, 1e-3)}),
                                   "running" if live else "completed", jid, t, None if live else rnd.random(), ended))
        if state == "PENDING":
            continue
        runs = 2 if rnd.random() < 0.1 else 1
        for n in range(runs):
            last = n == runs - 1
            end = None if state == "RUNNING" and last else (ended or started + 600) - (runs - 1 - n) * 60
            _run(rows, jid, t, n, state if last else "PREEMPTED", started + n * 60, end, last,
                 live and state != "COMPLETED")
        if points:
            rows["segments"].append((jid, t, runs - 1, 0, started, started + 30, 0, None, points, 60.0, points,
                                     started + 90, 0))
            rows["metrics"] += [(jid, t, "loss", s, 5.5 / (1 + s / 100) + t * 1e-4, 0, started + 30 + s)
                                for s in range(1, points + 1)]
    _job(rows, jid, group, submitted, "RUNNING" if live else ("COMPLETED" if all(s == "COMPLETED" for s in states)
                                                            else "FAILED"), started, ended, True, sweep_id)


def _iso(t: float | None) -> str:
    return "Unknown" if t is None else datetime.datetime.fromtimestamp(t).strftime("%Y-%m-%dT%H:%M:%S")


class AnsweringSlurm(QuietSlurm):
    """A Slurm whose sacct lists every run of the active jobs as the ledger has them (pending array tasks as one
    range row, as sacct prints them): a poll with nothing new."""

    def __init__(self, ledger: Ledger) -> None:
        self.rows: dict[str, list[dict[str, str]]] = {}
        found = ledger.db.execute(
            "SELECT j.slurm_job_id, j.is_array, a.task_index, a.state, a.started_at, a.ended_at, j.submitted_at "
            "FROM jobs j INDEXED BY jobs_open JOIN attempts a ON a.job_id = j.id WHERE j.site = ? AND j.ended_at IS "
            "NULL ORDER BY j.id, a.task_index, a.attempt", [SITE])
        for slurm_id, is_array, task, state, start, end, submitted in found:
            self.rows.setdefault(slurm_id, []).append(self._row(
                slurm_id + (f"_{task}" if is_array else ""), state, submitted, start, end))
        pending = ledger.db.execute(
            "SELECT j.slurm_job_id, t.task_index, j.submitted_at FROM jobs j INDEXED BY jobs_open JOIN array_tasks t "
            "ON t.job_id = j.id WHERE j.site = ? AND j.ended_at IS NULL AND t.state = 'PENDING'", [SITE])
        ranges: dict[str, list[Any]] = {}
        for slurm_id, task, submitted in pending:
            ranges.setdefault(slurm_id, [submitted]).append(task)
        for slurm_id, (submitted, *tasks) in ranges.items():
            self.rows.setdefault(slurm_id, []).append(
                self._row(f"{slurm_id}_[{','.join(map(str, tasks))}]", "PENDING", submitted, None, None))

    @staticmethod
    def _row(job_id: str, state: str, submitted: float, start: float | None, end: float | None) -> dict[str, str]:
        elapsed = "0" if start is None else str(int((end or start) - start))
        return {"JobID": job_id, "State": state, "ExitCode": "0:0", "Submit": _iso(submitted), "Start": _iso(start),
                "End": _iso(end), "ElapsedRaw": elapsed, "NodeList": "n[1-2]" if start else "None assigned",
                "AllocTRES": "gres/gpu=8" if start else "", "Reason": "None" if start else "Priority"}

    def sacct(self, job_ids: list[str], fields: tuple[str, ...]) -> list[dict[str, str]]:
        return [row for job_id in job_ids for row in self.rows.get(job_id, [])]


def heavy_commands(site_cfg, ids: dict[str, int]) -> dict[str, Callable[[Ledger, float], object]]:
    """Each command's work as the CLI does it, Slurm answered by AnsweringSlurm (made from the ledger on first use):
    the figures issue 41 asks for."""
    from hpctrain.jobs.accounting import add_idle, cost_totals
    from hpctrain.jobs.alerts import job_alerts
    from hpctrain.jobs.goodput import job_goodput
    from hpctrain.jobs.pending import waiting
    from hpctrain.jobs.poll import job_summaries, submissions
    from hpctrain.jobs.reconcile import reconcile
    from hpctrain.report import account_report
    from hpctrain.sweep.tick import tick_all

    slurm: list[AnsweringSlurm] = []

    def client(ledger: Ledger) -> AnsweringSlurm:
        if not slurm:
            slurm.append(AnsweringSlurm(ledger))
        return slurm[0]

    def status(ledger: Ledger, now: float) -> object:
        reconcile(ledger, client(ledger), SITE, supervise_runs=False)
        rows = submissions(job_summaries(ledger, SITE, active_only=True))
        return job_alerts(ledger, rows, site_cfg.alerts, now), waiting(rows, client(ledger), list)

    def show(ledger: Ledger, now: float) -> object:
        job_id = ids["big_array"]
        attempts = ledger.attempts.of_job(job_id)
        ledger.jobs.tasks(job_id), ledger.events.of_job(job_id)
        return job_goodput(attempts, ledger.segments.of_jobs([job_id]), now)

    def cost(by: str, days: int) -> Callable[[Ledger, float], object]:
        return lambda ledger, now: cost_totals(ledger, SITE, {}, by, since=now - days * DAY, now=now)

    def causes(ledger: Ledger, now: float) -> object:  # the GPU-hours held idle too (issue 61)
        groups = cost_totals(ledger, SITE, {}, "account", since=now - 30 * DAY, now=now)
        add_idle(ledger, groups, now - 30 * DAY)
        return groups

    return {
        "status": status,
        "status --all": lambda ledger, now: submissions(job_summaries(ledger, SITE)),
        f"show, {MAX_ARRAY:,}-task array": show,
        "metrics --tail 20, longest job": lambda ledger, now: ledger.metrics.tail(ids["long_job"], 20),
        "cost --since 7d": cost("job", 7),
        "cost --by account --since 30d": cost("account", 30),
        "cost --causes --by account --since 30d": causes,
        "report --account, 30 days": lambda ledger, now: account_report(ledger, site_cfg, "teama", now - 30 * DAY),
        "sweep tick": lambda ledger, now: tick_all(ledger, client(ledger), site_cfg),
        "reconcile": lambda ledger, now: reconcile(ledger, client(ledger), SITE),
    }
