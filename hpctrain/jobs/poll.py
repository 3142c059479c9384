"""Job state from Slurm into the ledger: one batched sacct call per poll, whatever the job count."""

from __future__ import annotations

import json
import time
from collections import Counter
from functools import partial
from typing import Any

from hpctrain.errors import SlurmError
from hpctrain.jobs.cancel import cancel_race_losers
from hpctrain.jobs.numbering import journaled_starts, numbered
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import AttemptFields, JobSummary, SubmittedJob
from hpctrain.runtime import secret_file
from hpctrain.runtime.attempts import RunPolicy
from hpctrain.slurm import sacct
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import CAUSE_OF_STATE, NO_MORE_RUNS, TERMINAL, array_state

# How far slurmctld's clock may run behind the one that stamped a job's submission in the ledger.
CLOCK_SKEW_S = 300.0


class Poller:
    """Refreshes every active tracked job of a site with one sacct call (one squeue call while sacct fails)."""

    def __init__(self, ledger: Ledger, client: SlurmClient, site: str):
        self.ledger, self.client, self.site = ledger, client, site
        self.warning: str | None = None  # set while states come from squeue instead of sacct

    def refresh(self) -> int:
        """Poll once, deciding the runs nobody decides on (one followed by another, the last of a job that runs no
        more) as reconcile does; returns how many jobs changed state (0 when nothing is active: no call then)."""
        jobs = self.ledger.jobs.active(self.site, TERMINAL)
        if not jobs:
            return 0
        ids = [j["slurm_job_id"] for j in jobs]
        try:
            found, self.warning = sacct.by_job(self.client.sacct(ids, sacct.FIELDS)), None
        except SlurmError as exc:
            # slurmdbd down: the controller still knows pending, running and recently ended jobs.
            found = sacct.by_job(self.client.squeue_states(ids))
            self.warning = f"{exc}; job states from squeue until accounting is back (no attempt history)"
        news = []
        for job in jobs:
            rows = found.get(job["slurm_job_id"], [])
            digest = sacct.digest(rows) if self.warning is None else None
            if rows and (digest is None or digest != job["sacct_digest"]):
                news.append((job, rows, digest))  # else nothing new since the last poll: nothing to read or write
        if not news and (self.warning is not None or not self.ledger.attempts.may_be_left_over(self.site)):
            return 0  # the usual poll of a status: no write lock taken
        changed, digests = 0, {}
        with self.ledger.transaction():
            for job, rows, digest in news:
                if job["submitted_at"] is not None:  # not an earlier job's rows under the same id
                    rows = sacct.submitted_since(rows, job["submitted_at"] - CLOCK_SKEW_S)
                tasks = sacct.histories(rows).get(job["slurm_job_id"], {})
                if job["is_array"]:  # a row under the array's own id without a task index names no task
                    tasks.pop(-1, None)
                if tasks and self._apply(job, tasks, attempts_known=self.warning is None):
                    changed += 1
                if digest is not None:
                    digests[job["id"]] = digest
            if self.warning is None:  # the runs it saw end that nothing else decides on (as reconcile's supervision)
                self.ledger.attempts.decide_left_over(self.site, NO_MORE_RUNS)
            self.ledger.jobs.polled(digests)  # after the decisions, which would make it forget the digests
        if changed:  # a run of a race started, say: its siblings still pending are cancelled now
            try:
                cancel_race_losers(self.ledger, self.client, self.site)
            except SlurmError as exc:
                self.warning = f"{exc}; the losers of a race are cancelled by a later poll"
        return changed

    def _apply(self, job: SubmittedJob, tasks: dict[int, sacct.TaskHistory], attempts_known: bool = True) -> bool:
        """Fold one job's sacct histories in, writing only the runs and task states that changed."""
        policy = RunPolicy.of(json.loads(job["spec_json"] or "{}"))
        base = job["attempt_base"]
        requeued_upto = self.ledger.attempts.last_requeued(job["id"])
        known = {(a["task_index"], a["attempt"]): a for a in self.ledger.attempts.of_job(job["id"])}
        starts_known: dict[int, dict[int, float | None]] = {}  # per task: each known run's start
        for (task_index, attempt), run_row in known.items():
            starts_known.setdefault(task_index, {})[attempt] = run_row["started_at"]
        last_known = {task_index: max(starts) for task_index, starts in starts_known.items()}
        task_rows = {t["task_index"]: t for t in self.ledger.jobs.tasks(job["id"])} if job["is_array"] else {}
        runs: dict[tuple[int, int], AttemptFields] = {}
        for index, history in tasks.items():
            history.requeue = policy.requeue
            numbers = numbered(  # the runs the ledger knows, against Slurm's overwritten rows
                history.attempts if attempts_known else [],
                base,
                starts_known.get(index, {}),
                partial(journaled_starts, job["job_dir"], index),
            )
            for n, a in numbers:
                run = AttemptFields(
                    slurm_job_id=job["slurm_job_id"] + (f"_{index}" if index >= 0 else ""),
                    state=a.state,
                    node_list=a.node_list,
                    started_at=a.start,
                    ended_at=a.end,
                    exit_code=a.exit_code,
                    alloc_gpus=a.gpus,
                    reason=a.reason,
                    elapsed_s=a.elapsed_s,
                    gpu_s=a.gpu_s,
                    idle_gpu_s=idle_gpu_seconds(a, policy.spare_gpus),
                )
                row = known.get((index, n))
                if row is None or any(row.get(k) != v for k, v in run.items()):
                    runs[index, n] = run
            after = max((n for n, _ in numbers), default=base + len(history.attempts) - 1) + 1
            if attempts_known and last_known.get(index, -1) >= after:
                self.ledger.attempts.drop_unstarted_from(job["id"], index, after)
            # A run requeued by hpctrain (its trainer, batch script or reconcile) whose next run sacct does
            # not list yet: still requeued, not finished.
            history.requeued_by_us = attempts_known and requeued_upto.get(index, -1) >= after - 1
            task = task_rows.get(index)
            if task is not None and (task["state"] != history.state or task["restarts"] < history.restarts):
                self.ledger.jobs.set_task_state(job["id"], index, history.state, history.restarts)
                task_rows[index] = {**task, "state": history.state}
        if runs:
            self.ledger.attempts.record_all(job["id"], runs)
            self.ledger.attempts.fill_causes(job["id"], CAUSE_OF_STATE)
        if job["is_array"]:
            state = array_state([t["state"] for t in task_rows.values()])
        else:
            state = tasks[-1].state if -1 in tasks else job["state"]
        secret_file.remove_when_final(job["job_dir"], job["id"], state)
        fields: dict[str, Any] = {}
        if attempts_known:
            starts = [a.start for h in tasks.values() for a in h.attempts if a.start]
            ends = [a.end for h in tasks.values() for a in h.attempts if a.end]
            fields.update(
                started_at=min(starts, default=None), ended_at=max(ends, default=None) if state in TERMINAL else None
            )
        if job["state"] != state or any(job.get(k) != v for k, v in fields.items()):
            self.ledger.jobs.set_state(job["id"], state, **fields)
            return True
        return False


def idle_gpu_seconds(run: sacct.Attempt, spare_gpus: int) -> float | None:
    """A run's GPU-seconds on its spare nodes while they waited: all it was allocated, less its job step's GPUs
    over the whole run (a spare that stood in for a failed node worked from then on)."""
    if run.gpu_s is None or run.elapsed_s is None:
        return None
    return max(run.gpu_s - (run.gpus - spare_gpus) * run.elapsed_s, 0.0) if spare_gpus else 0.0


def next_interval(current: float, start: float, maximum: float, changed: bool) -> float:
    """Back to ``start`` after a change; doubling up to ``maximum`` while nothing changes."""
    return start if changed else min(current * 2, maximum)


def job_summaries(ledger: Ledger, site: str, active_only: bool = False, limit: int = 200) -> list[JobSummary]:
    """One row per tracked job, newest first, with array task counts, restarts and preemptions (one query): every
    active job with ``active_only`` (``limit`` then does not apply), else the newest ``limit``."""
    return ledger.jobs.summaries(site, TERMINAL, active_only, -1 if active_only else limit)


def submissions(rows: list[JobSummary]) -> list[JobSummary]:
    """One row per submission, in the order of ``rows``: the jobs of an array split past MaxArraySize (one group)
    as one, under its first job's id and name, with every part's Slurm id, its tasks' states counted together, and
    the restarts and preemptions of all; a race's runners (`submit --race`) as one, in the state and on the site of
    the one that runs."""
    groups: dict[int, list[JobSummary]] = {}
    for r in rows:
        groups.setdefault(r["group_id"] or r["id"], []).append(r)
    out = []
    for parts in groups.values():
        parts.sort(key=lambda r: r["id"])
        counts: Counter[str] = Counter()
        for part in parts:
            for item in filter(None, (part["task_states"] or "").split(",")):
                state, n = item.rsplit(":", 1)
                counts[state] += int(n)
        merged = parts[0].copy()
        states = [p["state"] for p in parts]
        if parts[0]["race"]:  # the runner that won: the others were cancelled for it, or are about to be
            running = [p for p in parts if p["state"] != "CANCELLED"]
            states = [p["state"] for p in running] or ["CANCELLED"]
            if running:  # runners on several clusters: the one that runs
                merged["site"] = running[0]["site"]
        merged.update(
            {
                "slurm_job_id": ",".join(p["slurm_job_id"] or "-" for p in parts),
                "state": array_state(states) if len(states) > 1 else states[0],
                "tasks": sum(p["tasks"] for p in parts),
                "task_states": ",".join(f"{s}:{n}" for s, n in sorted(counts.items())) or None,
                "restarts": sum(p["restarts"] for p in parts),
                "preemptions": sum(p["preemptions"] for p in parts),
            }
        )
        out.append(merged)
    return out


def wait_finished(ledger: Ledger, client: SlurmClient, site: str, ledger_ids: list[int]) -> dict[int, str]:
    """Poll (one sacct call each time, backing off from 1 s to 15 s) until the jobs are finished; their states."""
    poller, interval = Poller(ledger, client, site), 1.0
    while True:
        changed = poller.refresh()
        states = {i: ledger.jobs.known(i)["state"] for i in ledger_ids}
        if all(s in TERMINAL for s in states.values()):
            return states
        interval = next_interval(interval, 1.0, 15.0, changed > 0)
        time.sleep(interval)
