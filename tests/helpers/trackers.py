"""A ledger with runs to export: a plain job and a two-task array job with step metrics, an evaluation, and registry
versions of both with aliases."""

from __future__ import annotations

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


def ledger_with_runs(ledger: Ledger, root: Path) -> tuple[int, int]:
    """(plain job, array job): the plain one COMPLETED with 40 steps, evaluated at 40 and registered as gpt:1
    (production); the array's task 0 COMPLETED, task 1 FAILED, 20 steps each, task 0 as gpt:2 (staging)."""
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
    register(ledger, "gpt", plain)
    register(ledger, "gpt", array, task=0)
    promote(ledger, decide(ledger, "gpt", 1, "production"))
    promote(ledger, decide(ledger, "gpt", 2, "staging"), why="canary", force=True)
    return plain, array
