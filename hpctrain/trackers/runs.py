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
    if sum(map(bool, (ids, sweep is not None, since is not None))) > 1:
        raise HpctrainError("give JOB ids, --sweep or --since, not more than one")
    if ids:
        jobs = [ledger.jobs.get(i) for i in ids]
        missing = [str(i) for i, j in zip(ids, jobs) if j is None]
        if missing:
            raise HpctrainError(f"job {', '.join(missing)}: no such ledger id (see `hpctrain status --all`)")
        return [j for j in jobs if j is not None]
    if sweep is not None:
        if ledger.sweeps.get(sweep) is None:
            raise HpctrainError(f"sweep {sweep!r}: no such sweep in the ledger")
        return ledger.jobs.of_sweep(sweep)
    if since is not None:
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


@dataclass(frozen=True)
class Point:
    """One value of a run: a metric's at a step, or an evaluation result (``<evaluator>/<name>``) at the checkpoint's
    step; ``seq`` is its place in the ledger's order of arrival (an evaluation's results share theirs)."""

    seq: int
    name: str
    step: int
    value: float
    at: float  # seconds since the epoch
    evaluation: bool = False


def points_after(ledger: Ledger, run: Run, seq: int = 0) -> list[Point]:
    """The run's values that reached the ledger after ``seq``, in that order (an evaluation's by name)."""
    job = run.job
    found = [
        Point(s, name, step, value, at if at is not None else job["submitted_at"] or 0.0)
        for s, name, step, value, at in ledger.metrics.after(job["id"], run.task_index, seq)
    ]
    for e in ledger.evaluations.done_after(job["id"], run.task_index, seq):
        values = json.loads(e["metrics_json"] or "{}")
        found += [
            Point(e["seq"], f"{e['evaluator']}/{name}", e["step"], float(value), e["done_at"] or 0.0, True)
            for name, value in sorted(values.items())
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
    return sorted(found, key=lambda p: (p.seq, p.name))
