"""Job state from Slurm into the ledger: one batched sacct call per poll, whatever the job count."""

from __future__ import annotations

import json
import time
from typing import Any

from hpctrain.errors import SlurmError
from hpctrain.ledger import Ledger
from hpctrain.runtime.attempts import RunPolicy
from hpctrain.slurm import sacct
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import CAUSE_OF_STATE, TERMINAL, array_state

# Why a run ended, from its Slurm state, until something more precise is journaled for it (constants only).
_FILL_CAUSE_SQL = (
    "UPDATE attempts SET cause = CASE state "
    + " ".join(f"WHEN '{state}' THEN '{cause}'" for state, cause in CAUSE_OF_STATE.items())
    + " END WHERE job_id = ? AND cause IS NULL AND state IN (" + ",".join(f"'{s}'" for s in CAUSE_OF_STATE) + ")"
)


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
            found, self.warning = sacct.histories(self.client.sacct(ids, sacct.FIELDS)), None
        except SlurmError as exc:
            # slurmdbd down: the controller still knows pending, running and recently ended jobs.
            found = sacct.histories(self.client.squeue_states(ids))
            self.warning = f"{exc}; job states from squeue until accounting is back (no attempt history)"
        changed = 0
        with self.ledger.transaction():
            for job in jobs:
                tasks = found.get(job["slurm_job_id"])
                if tasks and self._apply(job, tasks, attempts_known=self.warning is None):
                    changed += 1
        return changed

    def _apply(self, job: dict[str, Any], tasks: dict[int, sacct.TaskHistory], attempts_known: bool = True) -> bool:
        db, now = self.ledger.db, time.time()
        requeue = RunPolicy.of(json.loads(job["spec_json"] or "{}")).requeue
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


def wait_finished(ledger: Ledger, client: SlurmClient, site: str, ledger_ids: list[int]) -> dict[int, str]:
    """Poll (one sacct call each time, backing off from 1 s to 15 s) until the jobs are finished; their states."""
    poller, interval = Poller(ledger, client, site), 1.0
    while True:
        changed = poller.refresh()
        states = {i: ledger.get("jobs", i)["state"] for i in ledger_ids}
        if all(s in TERMINAL for s in states.values()):
            return states
        interval = next_interval(interval, 1.0, 15.0, changed > 0)
        time.sleep(interval)
