"""A year of a busy user's ledger, generated straight into SQLite: the history `status`, `show`, `cost`, `report`
and sweep ticks must not slow down with (tests/unit/ledger/test_ledger_scale.py, benchmarks/ledger_scale.py)."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sqlite3
from collections.abc import Callable
from pathlib import Path

from hpctrain.jobs.accounting import settle
from hpctrain.ledger import Ledger

DAY = 86400.0
SITE = "dev"
ACCOUNTS = ("teama", "teamb")
ENDED = ("COMPLETED", "COMPLETED", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
TRIALS_PER_SWEEP = 20
STEPS_PER_JOB = 1000  # of the jobs with metrics (the rest journaled none)
ACTIVE = 50  # jobs running or pending now, the newest ones


def traced(ledger: Ledger, read: Callable[[], object]) -> tuple[list[str], int]:
    """The statements ``read`` ran on the ledger (their parameters in them) and the SQLite VM steps they took: work
    counted by SQLite itself, the same on an idle machine and a loaded one."""
    conn, ran, steps = ledger.db.conn, [], [0]

    def step() -> int:
        steps[0] += 1
        return 0

    conn.set_trace_callback(ran.append)
    conn.set_progress_handler(step, 1)
    try:
        read()
    finally:
        conn.set_progress_handler(None, 0)
        conn.set_trace_callback(None)
    return ran, steps[0]


def spec_of(name: str, i: int) -> str:
    """A job's spec as the ledger keeps it (JSON)."""
    return json.dumps({"name": name, "command": ["python", "train.py", "--run", str(i)], "seed": i,
                       "resources": {"nodes": 2, "gpus_per_node": 4, "time": 14400, "account": "auto"},
                       "parallel": {"dp": 2, "tp": 2, "pp": 2}, "checkpoint": {"every_steps": 500},
                       "hyperparameters": {"lr": 3e-4, "warmup": 2000}})


def make_history(path: Path, jobs: int, sweeps: int, metric_rows: int, now: float, days: float = 365,
                 seed: int = 0) -> None:
    """``jobs`` jobs over the ``days`` before ``now`` (one array job of TRIALS_PER_SWEEP tasks per sweep among them,
    the newest ACTIVE still running), each with one run (a tenth requeued once; half the cancelled ones cancelled
    before they started, their run undecided as sacct left it), two events, two checkpoints,
    and ``metric_rows`` metric rows (STEPS_PER_JOB steps of loss for as many jobs as that takes); the runs of the
    settled jobs kept (`hpctrain.jobs.accounting.settle`)."""
    rnd = random.Random(seed)
    sweep_jobs = set(rnd.sample(range(jobs - ACTIVE), sweeps))
    with_metrics = set(rnd.sample(range(jobs - ACTIVE), min(metric_rows // STEPS_PER_JOB, jobs - ACTIVE)))
    with Ledger(path) as ledger:
        db = ledger.db.conn
        for first in range(0, jobs, 100_000):
            insert(db, _rows(rnd, range(first, min(first + 100_000, jobs)), jobs, now - days * DAY, now, sweep_jobs,
                             with_metrics))
        settle(ledger, SITE, now)  # as reconciles would have, a few each minute
        db.execute("ANALYZE")


COLUMNS = {  # in the order rows are inserted (foreign keys)
    "sweeps": ("id", "name", "method", "state", "spec_json", "created_at", "updated_at"),
    "jobs": ("id", "name", "site", "user", "account", "partition", "qos", "slurm_job_id", "is_array", "state",
             "submitted_at", "started_at", "ended_at", "spec_json", "group_id", "job_dir", "sweep_id", "updated_at",
             "journal_read_at"),
    "array_tasks": ("job_id", "task_index", "param_index", "params_json", "state", "updated_at"),
    "trials": ("sweep_id", "number", "params_json", "state", "job_id", "task_index", "value", "updated_at"),
    "attempts": ("job_id", "task_index", "attempt", "slurm_job_id", "state", "node_list", "started_at", "ended_at",
                 "exit_code", "alloc_gpus", "elapsed_s", "cause", "requeued", "decision"),
    "events": ("time", "kind", "job_id", "message"),
    "checkpoints": ("job_id", "step", "path", "state", "created_at", "bytes"),
    "segments": ("job_id", "task_index", "attempt", "step_restart", "main_at", "loaded_at", "resumed_from", "tier",
                 "steps", "step_seconds", "last_step", "last_step_at", "hung"),
    "metrics": ("job_id", "task_index", "name", "step", "value", "attempt", "time"),
}


def insert(db, rows: dict[str, list[tuple]]) -> None:
    """Rows of COLUMNS' tables, in their order, in one transaction."""
    for table, values in rows.items():
        if values:
            db.executemany(f"INSERT INTO {table} ({', '.join(COLUMNS[table])}) "
                           f"VALUES ({', '.join('?' * len(COLUMNS[table]))})", values)
    db.commit()


def _rows(rnd: random.Random, indices: range, jobs: int, first: float, now: float, sweep_jobs: set[int],
          with_metrics: set[int]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {table: [] for table in COLUMNS}
    for i in indices:
        jid, submitted = i + 1, first + i * (now - first) / jobs
        active = i >= jobs - ACTIVE
        state = rnd.choice(("RUNNING", "PENDING")) if active else rnd.choice(ENDED)
        unstarted = state == "CANCELLED" and rnd.random() < 0.5  # cancelled while pending
        started = submitted + 60 if state != "PENDING" and not unstarted else None
        ended = None if active else submitted + 600 if unstarted else started + rnd.uniform(600, 4 * 3600)
        sweep_id = f"sweep-{i}" if i in sweep_jobs else None
        if sweep_id:
            out["sweeps"].append((sweep_id, sweep_id, "random", "DONE", "{}", submitted, ended))
            for t in range(TRIALS_PER_SWEEP):
                out["array_tasks"].append((jid, t, t, "{}", "COMPLETED", ended))
                out["trials"].append((sweep_id, t, json.dumps({"lr": rnd.uniform(1e-4, 1e-3)}), "completed", jid, t,
                                      rnd.random(), ended))
        out["jobs"].append((jid, f"job-{i % 997}", SITE, "alice", ACCOUNTS[i % 2], "gpu", "normal", str(10_000 + i),
                            int(bool(sweep_id)), state, submitted, started, ended, spec_of(f"job-{i % 997}", i), jid,
                            f"/shared/logs/job-{i}", sweep_id, submitted, None if ended is None else ended + 300))
        out["events"].append((submitted, "submitted", jid, f"slurm job {10_000 + i}"))
        if unstarted:  # sacct lists the run that never started; no batch script decided on it
            out["attempts"].append((jid, -1, 0, str(10_000 + i), state, None, None, ended, "0:0", 0, 0, "cancelled",
                                    None, None))
        if started is None:
            continue
        runs = 2 if ended and rnd.random() < 0.1 else 1
        for a in range(runs):
            a_start = started + a * (ended - started) / runs if ended else started
            a_end = started + (a + 1) * (ended - started) / runs if ended else None
            last = a == runs - 1
            out["attempts"].append((jid, -1, a, str(10_000 + i), state if last else "PREEMPTED", "n[1-2]",
                                    a_start, a_end, "0:0", 8, None if a_end is None else int(a_end - a_start),
                                    (None if a_end is None else state.lower()) if last else "preemption",
                                    (None if a_end is None else 0) if last else 1, None if a_end is None else "-"))
        out["events"].append((ended or started, "attempt_end" if ended else "launch", jid, "-"))
        for k in (1, 2):
            out["checkpoints"].append((jid, 500 * k, f"/lustre/ckpt/job-{i}/step_{500 * k:08d}",
                                       "committed" if k == 2 else "deleted", started + k * 300, 2 << 30))
        if i in with_metrics:
            out["segments"].append((jid, -1, 0, 0, started, started + 30, 0, None, STEPS_PER_JOB, 900.0,
                                    STEPS_PER_JOB, started + 930, 0))
            out["metrics"] += [(jid, -1, "loss", s, 5.5 / (1 + s / 100), 0, started + 30 + s)
                               for s in range(1, STEPS_PER_JOB + 1)]
    return out


class QuietSlurm:
    """A Slurm that knows none of the jobs: what a command costs on hpctrain's side alone."""

    def ping(self) -> str:
        return "Slurmctld(primary) at quiet is UP"

    def sacct(self, job_ids: list[str], fields: tuple[str, ...]) -> list[dict[str, str]]:
        return []

    def pending_reasons(self, job_ids: list[str]) -> dict[str, str]:
        return {}


def commands(site_cfg) -> dict[str, Callable[[Ledger, float], object]]:
    """Each command's work on the ledger as the CLI does it (its Slurm calls answered by QuietSlurm): `status`
    (active jobs), `status --all`, `show` and `metrics --tail 20` of a job with metrics, `cost --since` a week and
    `cost --by account` over 30 days, `report --account` over 30 days, a sweep tick (cron's: reconcile with
    supervision, then the active sweeps) and `reconcile`."""
    from hpctrain.jobs.accounting import cost_totals
    from hpctrain.jobs.alerts import job_alerts
    from hpctrain.jobs.goodput import job_goodput
    from hpctrain.jobs.poll import job_summaries
    from hpctrain.jobs.reconcile import reconcile
    from hpctrain.jobs.stragglers import latest
    from hpctrain.report import account_report
    from hpctrain.sweep.tick import tick_all

    client = QuietSlurm()

    def status(ledger: Ledger, now: float) -> object:
        reconcile(ledger, client, SITE, supervise_runs=False)
        return job_alerts(ledger, job_summaries(ledger, SITE, active_only=True), site_cfg.alerts, now)

    def with_metrics(ledger: Ledger) -> int:
        return ledger.db.execute("SELECT min(job_id) FROM segments").fetchone()[0]

    def show(ledger: Ledger, now: float) -> object:
        job_id = with_metrics(ledger)
        attempts = ledger.attempts.of_job(job_id)
        ledger.jobs.tasks(job_id), ledger.events.of_job(job_id), latest(ledger, job_id)
        return job_goodput(attempts, ledger.segments.of_jobs([job_id]), now)

    return {
        "status": status,
        "status --all": lambda ledger, now: job_summaries(ledger, SITE),
        "show": show,
        "metrics --tail 20": lambda ledger, now: ledger.metrics.tail(with_metrics(ledger), 20),
        "cost --since 7 days": lambda ledger, now: cost_totals(ledger, SITE, {}, "job", since=now - 7 * DAY, now=now),
        "cost --by account, 30 days": lambda ledger, now: cost_totals(ledger, SITE, {}, "account", now - 30 * DAY, now),
        "report --account, 30 days": lambda ledger, now: account_report(ledger, site_cfg, "teama", now - 30 * DAY),
        "sweep tick": lambda ledger, now: tick_all(ledger, client, site_cfg),
        "reconcile": lambda ledger, now: reconcile(ledger, client, SITE),
    }


def killed_at(statement: int) -> Callable[[], None]:
    """A child's ``before``: the SQLite connections it opens kill it (SIGKILL) as the ``statement``-th statement,
    counted over them all, is given them."""

    def arm() -> None:
        count, connect = itertools.count(1), sqlite3.connect

        class Killing(sqlite3.Connection):
            def execute(self, *args):  # type: ignore[no-untyped-def]
                if next(count) == statement:
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().execute(*args)

        sqlite3.connect = lambda *args, **kwargs: connect(*args, factory=Killing, **kwargs)  # in the child only

    return arm


def ledger_in_child(path: Path, work: Callable[[Ledger], object], before: Callable[[], None] = lambda: None) -> int:
    """Fork a process that calls ``before``, then ``work`` on the ledger at ``path``; its pid (exit status 0 once
    done, 1 where it raised)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            before()
            with Ledger(path) as ledger:
                work(ledger)
            code = 0
        finally:
            os._exit(code)
    return pid
