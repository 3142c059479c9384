"""Sweeps and their trials in the ledger: registration, trial rows, and their states from the trial jobs."""

from __future__ import annotations

import json
import time
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
FINISHED = ("completed", "failed", "pruned")


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
        existing = ledger.get("sweeps", spec.name)
        if existing is not None:
            if existing["spec_json"] != spec_json:
                raise HpctrainError(f"sweep {spec.name!r} already exists with a different spec "
                                    f"(rename it, or `hpctrain sweep status {spec.name}`)")
            return load(ledger, spec.name), False
        ledger.insert("sweeps", {"id": spec.name, "name": spec.name, "method": spec.method, "state": "ACTIVE",
                                 "spec_json": spec_json, "created_at": time.time(), "updated_at": time.time()})
    return load(ledger, spec.name), True


def load(ledger: Ledger, sweep_id: str) -> Sweep:
    row = ledger.get("sweeps", sweep_id)
    if row is None:
        raise HpctrainError(f"sweep {sweep_id!r}: not in the ledger (see `hpctrain sweep status`)")
    data = json.loads(row["spec_json"])
    return Sweep(row["id"], SweepSpec.model_validate(data["sweep"]), JobSpec.model_validate(data["job"]), row["state"])


_TRIALS_SQL = """
SELECT tr.number, tr.params_json, tr.state AS trial_state, tr.job_id, tr.task_index, tr.failures, tr.value,
       j.slurm_job_id, j.state = 'SUBMIT_FAILED' AS unsent, t.state AS task_state
FROM trials tr LEFT JOIN jobs j ON j.id = tr.job_id
LEFT JOIN array_tasks t ON t.job_id = tr.job_id AND t.task_index = tr.task_index
WHERE tr.sweep_id = ? ORDER BY tr.number
"""
# The metric's last reported value per trial (the value of a finished trial).
_FINAL_SQL = """
SELECT tr.number, m.value FROM trials tr JOIN metrics m ON m.job_id = tr.job_id AND m.task_index = tr.task_index
WHERE tr.sweep_id = ? AND m.name = ? AND m.step = (SELECT max(step) FROM metrics m2 WHERE m2.job_id = m.job_id
      AND m2.task_index = m.task_index AND m2.name = m.name)
"""


def trial_state(trial_state: str, task_state: str | None) -> str:
    """A trial's state from its array task's (an early-stopped trial stays pruned, a new one new)."""
    if trial_state in ("new", "pruned") or task_state is None:
        return trial_state
    if task_state in TASK_TO_TRIAL:
        return TASK_TO_TRIAL[task_state]
    from hpctrain.slurm.states import TERMINAL

    return "failed" if task_state in TERMINAL else "pending"


def refresh(ledger: Ledger, sweep: Sweep) -> list[dict[str, Any]]:
    """Trial rows with states from their tasks and values from their metrics, written back where changed."""
    rows = [dict(r) for r in ledger.db.query(_TRIALS_SQL, [sweep.id])]
    final = dict(ledger.db.execute(_FINAL_SQL, [sweep.id, sweep.spec.metric]).fetchall())
    changed, unsent = [], []
    for r in rows:
        if r["unsent"]:  # its sbatch failed (Slurm down): submitted again as new, not a failure of the trial
            unsent.append((time.time(), sweep.id, r["number"]))
            r.update(state="new", job_id=None, task_index=None)
            continue
        state, value = trial_state(r["trial_state"], r["task_state"]), final.get(r["number"])
        if (state, value) != (r["trial_state"], r["value"]):
            changed.append((state, value, time.time(), sweep.id, r["number"]))
        r["state"], r["value"] = state, value
    if changed or unsent:
        with ledger.transaction():
            ledger.db.conn.executemany("UPDATE trials SET state = ?, value = ?, updated_at = ? "
                                       "WHERE sweep_id = ? AND number = ?", changed)
            ledger.db.conn.executemany("UPDATE trials SET state = 'new', job_id = NULL, task_index = NULL, "
                                       "updated_at = ? WHERE sweep_id = ? AND number = ?", unsent)
    return rows


def intermediate(ledger: Ledger, sweep: Sweep, numbers: list[int], metric: str) -> dict[int, dict[int, float]]:
    """The metric by step for these trials (early stopping reads only the running ones)."""
    out: dict[int, dict[int, float]] = {n: {} for n in numbers}
    if not numbers:
        return out
    sql = ("SELECT tr.number, m.step, m.value FROM trials tr JOIN metrics m ON m.job_id = tr.job_id "
           "AND m.task_index = tr.task_index WHERE tr.sweep_id = ? AND m.name = ? AND tr.number IN "
           f"({','.join('?' * len(numbers))})")
    for number, step, value in ledger.db.execute(sql, [sweep.id, metric, *numbers]):
        out[number][step] = value
    return out


def records(rows: list[dict[str, Any]], curves: dict[int, dict[int, float]]) -> list[TrialRecord]:
    """Trial rows as the search methods see them ("new" trials are pending to them)."""
    return [TrialRecord(r["number"], json.loads(r["params_json"]), "pending" if r["state"] == "new" else r["state"],
                        r["value"], curves.get(r["number"], {})) for r in rows]


_TABLE_SQL = """
SELECT tr.number, tr.params_json, tr.state, tr.value, tr.failures, tr.reason, j.slurm_job_id, tr.task_index,
       (SELECT sum(a.alloc_gpus * (coalesce(a.ended_at, :now) - a.started_at)) / 3600.0 FROM attempts a
        WHERE a.job_id = tr.job_id AND a.task_index = tr.task_index AND a.started_at IS NOT NULL) AS gpu_hours
FROM trials tr LEFT JOIN jobs j ON j.id = tr.job_id WHERE tr.sweep_id = :sweep ORDER BY tr.number
"""


def trial_table(ledger: Ledger, sweep: Sweep) -> list[dict[str, Any]]:
    """Every trial with its parameters, state, value and GPU-hours so far (one query)."""
    rows = [dict(r) for r in ledger.db.query(_TABLE_SQL, {"now": time.time(), "sweep": sweep.id})]
    for r in rows:
        r["params"] = json.loads(r.pop("params_json"))
        r["gpu_hours"] = r["gpu_hours"] or 0.0
    return rows


def best(rows: list[dict[str, Any]], direction: str) -> dict[str, Any] | None:
    done = [r for r in rows if r["state"] == "completed" and r["value"] is not None]
    pick = min if direction == "minimize" else max
    return pick(done, key=lambda r: r["value"]) if done else None
