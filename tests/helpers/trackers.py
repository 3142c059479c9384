"""A ledger with runs to export: a plain job and a two-task array job with step metrics, an evaluation, and registry
versions of both with aliases; and what a tracker must then hold of it."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

from hpctrain.ledger import Ledger
from hpctrain.registry.aliases import decide, promote
from hpctrain.registry.versions import register

from helpers.registry import evaluated, job_with_checkpoints, record_checkpoint

T0 = 1_790_000_000.0  # the first step's time


def metrics(ledger: Ledger, job_id: int, task_index: int, steps: range, base: float = 3.0) -> None:
    for step in steps:
        ledger.metrics.record(job_id, task_index, step, {"loss": base / step, "lr": 1e-3, "step_time_s": 0.5}, 0,
                              T0 + step)


def ledger_with_runs(ledger: Ledger, root: Path, model: str = "gpt") -> tuple[int, int]:
    """(plain job, array job): the plain one COMPLETED with 40 steps, evaluated at 40 and registered as gpt:1
    (production); the array's task 0 COMPLETED, task 1 FAILED, 20 steps each, task 0 as gpt:2 (staging). ``model``
    names the registered model (tests sharing one MLflow server each name their own)."""
    plain = job_with_checkpoints(ledger, root, "gpt-a", (40,))
    metrics(ledger, plain, -1, range(1, 41))
    evaluated(ledger, plain, 40, 2.5)
    array = ledger.jobs.record({"name": "gpt-b", "site": "dev", "is_array": 1, "lineage_json": {"seed": 3}},
                               [{"task_index": i, "param_index": i, "params_json": f'{{"lr": {i + 1}e-3}}'}
                                for i in (0, 1)])
    ledger.jobs.submitted(array, "4242")
    ledger.jobs.set_state(array, "FAILED", started_at=T0, ended_at=T0 + 100)
    for task, state in ((0, "COMPLETED"), (1, "FAILED")):
        ledger.jobs.set_task_state(array, task, state)
        metrics(ledger, array, task, range(1, 21), base=4.0 + task)
    record_checkpoint(ledger, array, 0, root / "gpt-b" / "task-0", 20)
    register(ledger, model, plain)
    register(ledger, model, array, task=0)
    promote(ledger, decide(ledger, model, 1, "production"))
    promote(ledger, decide(ledger, model, 2, "staging"), why="canary", force=True)
    return plain, array


def ledger_points(ledger_path: Path) -> dict[tuple[str, str], Counter]:
    """What the ledger holds, read with sqlite3 alone: per (job id, task index) as MLflow tags them, each
    (metric name, step, value, time in ms) once; evaluation results as ``<evaluator>/<name>``."""
    db = sqlite3.connect(ledger_path)
    found: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for job, task, name, step, value, at in db.execute(
            "SELECT job_id, task_index, name, step, value, time FROM metrics WHERE value IS NOT NULL"):
        found[(str(job), str(task))][(name, step, value, int(at * 1000))] += 1
    for job, task, step, evaluator, values, at in db.execute(
            "SELECT job_id, task_index, step, evaluator, metrics_json, done_at FROM evaluations WHERE state = 'done'"):
        for name, value in json.loads(values).items():
            found[(str(job), str(task))][(f"{evaluator}/{name}", step, value, int(at * 1000))] += 1
    db.close()
    return found


def assert_one_clean_copy(client, experiment: str, ledger_path: Path, runs: int) -> None:
    """The experiment holds ``runs`` runs, one per job's task, none RUNNING (every job of the ledger has ended), and
    each holds every value of the ledger's once and nothing else."""
    exp = client.get_experiment_by_name(experiment)
    held = client.search_runs([exp.experiment_id])
    keys = [(r.data.tags["hpctrain.ledger_job_id"], r.data.tags.get("hpctrain.task_index", "-1")) for r in held]
    assert len(held) == runs and len(set(keys)) == runs, sorted(keys)
    assert [r.info.run_name for r in held if r.info.status == "RUNNING"] == []
    expected = ledger_points(ledger_path)
    for key, run in zip(keys, held):
        points = Counter((m.key, m.step, m.value, m.timestamp) for name in run.data.metrics
                         for m in client.get_metric_history(run.info.run_id, name))
        assert points == expected.get(key, Counter()), (run.info.run_name, points - expected[key], expected[key] - points)
