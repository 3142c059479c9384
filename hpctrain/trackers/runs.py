"""What a tracker gets of the ledger, whatever the tracker: the jobs chosen, each task as a run with its name,
settings, tags, state and times, and its metrics and evaluation results."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.evaluations import DONE
from hpctrain.ledger.rows import JobRow
from hpctrain.report.compare import settings

# A run's state in trackers' words (MLflow's RunStatus names), from the Slurm state of the job or its task.
FINISHED, FAILED, KILLED, RUNNING, SCHEDULED = "FINISHED", "FAILED", "KILLED", "RUNNING", "SCHEDULED"
KILLED_STATES = ("CANCELLED", "PREEMPTED", "REVOKED")
LIVE_STATES = ("RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STOPPED", "SIGNALING")


@dataclass(frozen=True)
class Run:
    """One job's task as a tracker's run."""

    job: JobRow
    task_index: int
    name: str
    state: str  # the Slurm state of the job or task
    params: dict[str, str]
    tags: dict[str, str]

    @property
    def status(self) -> str:
        if self.state == "COMPLETED":
            return FINISHED
        if self.state in KILLED_STATES:
            return KILLED
        if self.state in LIVE_STATES:
            return RUNNING
        return SCHEDULED if self.state in ("NEW", "PENDING", "SUBMITTING") else FAILED

    @property
    def key(self) -> tuple[int, int]:
        return self.job["id"], self.task_index


def chosen_jobs(
    ledger: Ledger, site: str, job_ids: Iterable[int] = (), sweep: str | None = None, since: str | None = None
) -> list[JobRow]:
    """The jobs named (each must be in the ledger), a sweep's, those submitted since a day, or else every job of
    the site."""
    ids = list(job_ids)
    if sum(map(bool, (ids, sweep, since))) > 1:
        raise HpctrainError("give JOB ids, --sweep or --since, not more than one")
    if ids:
        jobs = [ledger.jobs.get(i) for i in ids]
        missing = [str(i) for i, j in zip(ids, jobs) if j is None]
        if missing:
            raise HpctrainError(f"job {', '.join(missing)}: no such ledger id (see `hpctrain status --all`)")
        return [j for j in jobs if j is not None]
    if sweep:
        if ledger.sweeps.get(sweep) is None:
            raise HpctrainError(f"sweep {sweep!r}: no such sweep in the ledger")
        return ledger.jobs.of_sweep(sweep)
    if since:
        try:
            day = datetime.fromisoformat(since).timestamp()
        except ValueError:
            raise HpctrainError(f"--since: expected a date such as 2026-11-01, got {since!r}") from None
        return ledger.jobs.submitted_since(site, day)
    return ledger.jobs.of_site(site)


def runs_of(ledger: Ledger, job: JobRow) -> list[Run]:
    """The job's runs: one, or one per array task (a sweep's trials)."""
    lineage = json.loads(job["lineage_json"] or "{}")
    tags = {
        "hpctrain.ledger_job_id": str(job["id"]),
        "hpctrain.site": job["site"],
        "hpctrain.slurm_job_id": job["slurm_job_id"] or "",
        "hpctrain.account": job["account"] or "",
        "hpctrain.partition": job["partition"] or "",
        "hpctrain.qos": job["qos"] or "",
        "hpctrain.sweep": job["sweep_id"] or "",
        "mlflow.user": job["user"] or "",
    }
    code = lineage.get("code") or {}
    if code.get("commit"):
        tags["mlflow.source.git.commit"] = code["commit"]
        tags["hpctrain.code.dirty"] = str(bool(code.get("dirty"))).lower()
    if (lineage.get("data") or {}).get("sha256"):
        tags["hpctrain.data.sha256"] = lineage["data"]["sha256"]
    tasks = ledger.jobs.tasks(job["id"]) if job["is_array"] else []
    if not tasks:
        return [Run(job, -1, job["name"], job["state"], _params(job, {}), tags)]
    return [
        Run(
            job,
            t["task_index"],
            f"{job['name']}[{t['task_index']}]",
            t["state"],
            _params(job, json.loads(t["params_json"] or "{}")),
            {**tags, "hpctrain.task_index": str(t["task_index"])},
        )
        for t in tasks
    ]


def _params(job: JobRow, params: dict[str, Any]) -> dict[str, str]:
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in settings(job, params).items()}


def evaluations_after(ledger: Ledger, run: Run, after: float) -> list[tuple[int, str, dict[str, float], float]]:
    """(step, evaluator, metrics, done_at) of the run's evaluations done after ``after``, oldest first."""
    found = [
        (e["step"], e["evaluator"], json.loads(e["metrics_json"]), e["done_at"] or 0.0)
        for e in ledger.evaluations.of_job(run.job["id"])
        if e["task_index"] == run.task_index
        and e["state"] == DONE
        and e["metrics_json"]
        and (e["done_at"] or 0) > after
    ]
    return sorted(found, key=lambda e: e[3])
