"""Sweeps and their trials in the ledger: registration, trial rows, and their states from the trial jobs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config.job import JobSpec
from hpctrain.config.loading import validate
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.sweep.methods import TrialRecord
from hpctrain.sweep.spec import SweepSpec

# A trial row's state: "new" (suggested, not yet submitted) or the state of its job's array task.
TASK_TO_TRIAL = {"COMPLETED": "completed", "RUNNING": "running", "CANCELLED": "failed"}


@dataclass
class Sweep:
    id: str
    spec: SweepSpec
    job: JobSpec
    state: str


def register(ledger: Ledger, spec: SweepSpec, source: Path) -> tuple[Sweep, bool]:
    """Record the sweep under its name, with its job spec resolved now (ticks do not need the files again).
    Idempotent: the same spec again returns the existing sweep (False); a different one is an error."""
    if isinstance(spec.job, str):
        from hpctrain.config import load_job_spec

        path = Path(spec.job) if Path(spec.job).is_absolute() else source.parent / spec.job
        job = load_job_spec(path)
    else:
        job = validate(JobSpec, spec.job, source, prefix=("job",))
    if job.array is not None:
        raise ConfigError(f"{source}: job: array: a sweep makes its own arrays of trials; remove it")
    spec_json = json.dumps({"sweep": spec.model_dump(mode="json"), "job": job.redacted()}, sort_keys=True)
    with ledger.transaction():
        existing = ledger.sweeps.get(spec.name)
        if existing is not None:
            if existing["spec_json"] != spec_json:
                raise HpctrainError(
                    f"sweep {spec.name!r} already exists with a different spec "
                    f"(rename it, or `hpctrain sweep status {spec.name}`)"
                )
            return load(ledger, spec.name), False
        ledger.sweeps.create(spec.name, spec.method, spec_json)
    return load(ledger, spec.name), True


def load(ledger: Ledger, sweep_id: str) -> Sweep:
    row = ledger.sweeps.get(sweep_id)
    if row is None:
        raise HpctrainError(f"sweep {sweep_id!r}: not in the ledger (see `hpctrain sweep status`)")
    data = json.loads(row["spec_json"] or "{}")
    return Sweep(row["id"], SweepSpec.model_validate(data["sweep"]), JobSpec.model_validate(data["job"]), row["state"])


def trial_state(trial_state: str, task_state: str | None, reporting: bool = False) -> str:
    """A trial's state from its array task's (an early-stopped trial stays pruned, a new one new). A trial
    that ``reporting`` (its metric has values) runs even while its task still shows as pending: accounting
    can lag behind a job on a busy cluster, and sacct can list an array's last task under the array's own
    id, still PENDING, while it runs."""
    if trial_state in ("new", "pruned") or task_state is None:
        return trial_state
    if task_state in TASK_TO_TRIAL:
        return TASK_TO_TRIAL[task_state]
    from hpctrain.slurm.states import TERMINAL

    if task_state in TERMINAL:
        return "failed"
    return "running" if reporting else "pending"


def refresh(ledger: Ledger, sweep: Sweep) -> list[dict[str, Any]]:
    """Trial rows with states from their tasks and values from their metrics, written back where changed."""
    rows: list[dict[str, Any]] = [dict(r) for r in ledger.sweeps.trials_with_tasks(sweep.id)]
    final = ledger.sweeps.final_values(sweep.id, sweep.spec.metric)
    changed, unsent = [], []
    for r in rows:
        if r["unsent"]:  # its sbatch failed (Slurm down): submitted again as new, not a failure of the trial
            unsent.append(r["number"])
            r.update(state="new", job_id=None, task_index=None)
            continue
        value = final.get(r["number"])
        state = trial_state(r["trial_state"], r["task_state"], reporting=value is not None)
        if (state, value) != (r["trial_state"], r["value"]):
            changed.append((r["number"], state, value))
        r["state"], r["value"] = state, value
    ledger.sweeps.set_outcomes(sweep.id, changed)
    ledger.sweeps.unlink(sweep.id, unsent)
    return rows


def intermediate(ledger: Ledger, sweep: Sweep, numbers: list[int], metric: str) -> dict[int, dict[int, float]]:
    """The metric by step for these trials (early stopping reads only the running ones)."""
    return ledger.sweeps.curves(sweep.id, metric, numbers)


def records(rows: list[dict[str, Any]], curves: dict[int, dict[int, float]]) -> list[TrialRecord]:
    """Trial rows as the search methods see them ("new" trials are pending to them)."""
    return [
        TrialRecord(
            r["number"],
            json.loads(r["params_json"]),
            "pending" if r["state"] == "new" else r["state"],
            r["value"],
            curves.get(r["number"], {}),
        )
        for r in rows
    ]


def trial_table(ledger: Ledger, sweep: Sweep) -> list[dict[str, Any]]:
    """Every trial with its parameters, state, value and GPU-hours so far (one query)."""
    rows: list[dict[str, Any]] = [dict(r) for r in ledger.sweeps.table(sweep.id)]
    for r in rows:
        r["params"] = json.loads(r.pop("params_json"))
        r["gpu_hours"] = r["gpu_hours"] or 0.0
    return rows


def best(rows: list[dict[str, Any]], direction: str) -> dict[str, Any] | None:
    done = [r for r in rows if r["state"] == "completed" and r["value"] is not None]
    pick = min if direction == "minimize" else max
    return pick(done, key=lambda r: r["value"]) if done else None


def no_best(rows: list[dict[str, Any]], metric: str) -> str:
    """Why ``best`` found no trial: none has completed yet, or none of those that did reported the metric."""
    completed = sum(r["state"] == "completed" for r in rows)
    if not completed:
        return "no completed trial yet"
    return (
        f"no completed trial reported the sweep's metric {metric!r} ({completed} completed; a trial reports it "
        f"with hpctrain.runtime.log_metrics)"
    )
