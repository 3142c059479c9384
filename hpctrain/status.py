"""Job state from Slurm into the ledger: one batched sacct call per poll, whatever the job count.

`sacct -X -D` lists one row per allocation attempt (a requeued or preempted run keeps its row),
with array tasks expanded and a still-pending task range in one row. Restart and preemption
counts come from those rows (sacct in 22.05 has no restart-count field).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hpctrain.ledger import Ledger
from hpctrain.runtime.attempts import CAUSE_OF_STATE
from hpctrain.errors import SlurmError
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit.secret_file import remove_when_final

SACCT_FIELDS = ("JobID", "State", "ExitCode", "Submit", "Start", "End", "ElapsedRaw", "NodeList", "AllocTRES", "Reason")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL",
            "DEADLINE", "PREEMPTED", "REVOKED", "SUBMIT_FAILED", "LOST"}
_JOBID = re.compile(r"^(\d+)(?:_(\d+|\[[^\]]*\]))?$")
_GPUS = re.compile(r"gres/gpu(?::[^=,]+)?=(\d+)")


# Why a run ended, from its Slurm state, until something more precise is journaled for it (constants only).
_FILL_CAUSE_SQL = (
    "UPDATE attempts SET cause = CASE state "
    + " ".join(f"WHEN '{state}' THEN '{cause}'" for state, cause in CAUSE_OF_STATE.items())
    + " END WHERE job_id = ? AND cause IS NULL AND state IN (" + ",".join(f"'{s}'" for s in CAUSE_OF_STATE) + ")"
)


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


def normal_state(text: str) -> str:
    """'CANCELLED by 0' -> 'CANCELLED'."""
    return text.split()[0] if text else "UNKNOWN"


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


# A run that ended like this is requeued by Slurm when the job allows requeue; the next run's
# record may not be in slurmdbd yet, so the job is not finished.
REQUEUE_STATES = {"PREEMPTED", "NODE_FAIL", "REQUEUED"}


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


def histories(rows: list[dict[str, str]]) -> dict[str, dict[int, TaskHistory]]:
    """sacct rows -> {base job id: {task index (-1: not an array): history}}.

    A pending-range row (``2_[6-11%3]``) stands for tasks that have not started; a task with a row of its
    own is left out of it: sacct can list a throttled array's task in both for a while after it starts.
    """
    out: dict[str, dict[int, TaskHistory]] = {}
    own = {m.groups() for m in map(_JOBID.match, (row["JobID"] for row in rows)) if m and m[2] and m[2][0] != "["}
    for row in rows:
        m = _JOBID.match(row["JobID"])
        if not m:
            continue  # a step such as 12.batch
        base, task = m.groups()
        tasks = [-1] if task is None else (
            [t for t in expand_task_range(task) if (base, str(t)) not in own] if task.startswith("[") else [int(task)])
        gpus = _GPUS.search(row.get("AllocTRES", ""))
        attempt = Attempt(
            normal_state(row["State"]), parse_time(row.get("Submit", "")), parse_time(row.get("Start", "")),
            parse_time(row.get("End", "")), row.get("NodeList", ""), row.get("ExitCode", ""),
            int(gpus.group(1)) if gpus else 0, row.get("Reason", ""),
            int(row["ElapsedRaw"]) if row.get("ElapsedRaw", "").isdigit() else None,
        )
        for t in tasks:
            out.setdefault(base, {}).setdefault(t, TaskHistory()).attempts.append(attempt)
    for tasks in out.values():
        for h in tasks.values():
            h.attempts.sort(key=lambda a: (a.submit or 0, a.start or float("inf")))
    return out


def array_state(states: list[str]) -> str:
    if any(s == "RUNNING" for s in states):
        return "RUNNING"
    if any(s not in TERMINAL for s in states):
        return "PENDING"
    if all(s == "COMPLETED" for s in states):
        return "COMPLETED"
    return "CANCELLED" if any(s == "CANCELLED" for s in states) else "FAILED"


class Poller:
    """Refreshes every active tracked job of a site with one sacct call (one squeue call while sacct fails)."""

    def __init__(self, ledger: Ledger, client: SlurmClient, site: str):
        self.ledger, self.client, self.site = ledger, client, site
        self.warning: str | None = None  # set while states come from squeue instead of sacct

    def active_jobs(self) -> list[dict[str, Any]]:
        placeholders = ",".join("?" * len(TERMINAL))
        return self.ledger.rows("jobs", f"site = ? AND slurm_job_id IS NOT NULL AND state NOT IN ({placeholders})",
                                [self.site, *sorted(TERMINAL)])

    def refresh(self) -> int:
        """Poll once; returns how many jobs changed state (0 when nothing is active: no call then)."""
        jobs = self.active_jobs()
        if not jobs:
            return 0
        ids = [j["slurm_job_id"] for j in jobs]
        try:
            found, self.warning = histories(self.client.sacct(ids, SACCT_FIELDS)), None
        except SlurmError as exc:
            # slurmdbd down: the controller still knows pending, running and recently ended jobs.
            found = histories(self.client.squeue_states(ids))
            self.warning = f"{exc}; job states from squeue until accounting is back (no attempt history)"
        changed = 0
        with self.ledger.transaction():
            for job in jobs:
                tasks = found.get(job["slurm_job_id"])
                if tasks and self._apply(job, tasks, attempts_known=self.warning is None):
                    changed += 1
        return changed

    def _apply(self, job: dict[str, Any], tasks: dict[int, TaskHistory], attempts_known: bool = True) -> bool:
        db, now = self.ledger.db, time.time()
        requeue = json.loads(job["spec_json"] or "{}").get("requeue", True)
        base = job["attempt_base"]
        requeued_upto = dict(db.execute("SELECT task_index, max(attempt) FROM attempts WHERE job_id = ? AND requeued = 1 "
                                        "GROUP BY task_index", [job["id"]]).fetchall())
        for index, history in tasks.items():
            history.requeue = requeue
            for n, a in enumerate(history.attempts if attempts_known else ()):
                db.table("attempts").upsert(
                    {"job_id": job["id"], "task_index": index, "attempt": base + n, "slurm_job_id": job["slurm_job_id"]
                     + (f"_{index}" if index >= 0 else ""), "state": a.state, "node_list": a.node_list,
                     "started_at": a.start, "ended_at": a.end, "exit_code": a.exit_code, "alloc_gpus": a.gpus,
                     "reason": a.reason, "elapsed_s": a.elapsed_s},
                    pk=("job_id", "task_index", "attempt"),
                )
            if attempts_known:  # runs sacct once listed and no longer does (a throttled array's task seen twice)
                db.execute("DELETE FROM attempts WHERE job_id = ? AND task_index = ? AND attempt >= ? "
                           "AND state = 'PENDING' AND started_at IS NULL AND step_start IS NULL AND cause IS NULL",
                           [job["id"], index, base + len(history.attempts)])
            # A run requeued by hpctrain (its trainer, batch script or reconcile) whose next run sacct does
            # not list yet: still requeued, not finished.
            history.requeued_by_us = attempts_known and requeued_upto.get(index, -1) >= base + history.restarts
            if index >= 0:
                db.execute("UPDATE array_tasks SET state = ?, restarts = max(restarts, ?), updated_at = ? "
                           "WHERE job_id = ? AND task_index = ?", [history.state, history.restarts, now, job["id"], index])
        db.execute(_FILL_CAUSE_SQL, [job["id"]])
        if job["is_array"]:
            known = {r["task_index"]: r["state"] for r in self.ledger.rows("array_tasks", "job_id = ?", [job["id"]])}
            state = array_state(list(known.values()))
        else:
            state = tasks[-1].state if -1 in tasks else job["state"]
        remove_when_final(job["job_dir"], job["id"], state)
        fields: dict[str, Any] = {"state": state}
        if attempts_known:
            starts = [a.start for h in tasks.values() for a in h.attempts if a.start]
            ends = [a.end for h in tasks.values() for a in h.attempts if a.end]
            fields.update(started_at=min(starts, default=None),
                          ended_at=max(ends, default=None) if state in TERMINAL else None)
        if any(job.get(k) != v for k, v in fields.items()):
            self.ledger.update("jobs", job["id"], {**fields, "updated_at": now})
            return True
        return False


def next_interval(current: float, start: float, maximum: float, changed: bool) -> float:
    """Back to ``start`` after a change; doubling up to ``maximum`` while nothing changes."""
    return start if changed else min(current * 2, maximum)


SUMMARY_SQL = """
SELECT j.id, j.name, j.slurm_job_id, j.state, j.account, j.qos, j.partition, j.is_array, j.group_id,
       j.sweep_id, j.submitted_at, j.started_at, j.ended_at,
       (SELECT count(*) FROM array_tasks t WHERE t.job_id = j.id) AS tasks,
       (SELECT group_concat(state || ':' || n) FROM (SELECT state, count(*) AS n FROM array_tasks t
            WHERE t.job_id = j.id GROUP BY state)) AS task_states,
       (SELECT count(*) - count(DISTINCT a.task_index) FROM attempts a WHERE a.job_id = j.id) AS restarts,
       (SELECT count(*) FROM attempts a WHERE a.job_id = j.id AND a.state = 'PREEMPTED') AS preemptions
FROM jobs j
WHERE j.site = ? {where}
ORDER BY j.id DESC
LIMIT ?
"""


def job_summaries(ledger: Ledger, site: str, active_only: bool = False, limit: int = 200) -> list[dict[str, Any]]:
    """One row per tracked job with array task counts, restarts and preemptions (one SQL query)."""
    where = ""
    args: list[Any] = [site]
    if active_only:
        where = f"AND j.state NOT IN ({','.join('?' * len(TERMINAL))})"
        args += sorted(TERMINAL)
    return [dict(r) for r in ledger.db.query(SUMMARY_SQL.format(where=where), [*args, limit])]
