"""Ledger rows for the registry's tests: jobs with specs and lineage, their committed checkpoints (small real ones
written by the Checkpointer), and evaluation results."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from hpctrain.checkpoint import Checkpointer, Retention
from hpctrain.contract import EVAL_LOSS
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table


def job_with_checkpoints(ledger: Ledger, root: Path, name: str, steps: tuple[int, ...],
                         spec: dict[str, Any] | None = None) -> int:
    """A completed job of the ledger whose checkpoints at ``steps`` are committed under ``root/name``."""
    spec = {"name": name, "command": ["python", "-m", "hpctrain.train"], "seed": 7, **(spec or {})}
    lineage = {"code": {"commit": "abc123", "dirty": False}, "data": {"index": "/data/index.json", "sha256": "d" * 64},
               "hyperparameters": {"lr": 0.001}, "seed": 7, "parallel": {"dp": 1}, "versions": {"hpctrain": "0.1.0"}}
    job_id = Table(ledger, "jobs").insert({"name": name, "site": "dev", "state": "COMPLETED", "spec_json": spec,
                                           "lineage_json": lineage})
    for step in steps:
        record_checkpoint(ledger, job_id, -1, root / name, step)
    return job_id


def record_checkpoint(ledger: Ledger, job_id: int, task_index: int, directory: Path, step: int,
                      state: dict[str, Any] | None = None) -> None:
    """A real checkpoint of ``step`` (``state``, by default a small one) committed in ``directory``, and its row as
    the job's task journaled it."""
    with Checkpointer(directory, retention=Retention(keep_last=100), journal=None) as ck:
        ck.save(step, state or {"w": np.full(4, float(step), dtype=np.float32)})
    ledger.checkpoints.record({"job_id": job_id, "task_index": task_index, "step": step,
                               "path": str(directory / f"step_{step:08d}"), "state": "committed",
                               "created_at": time.time(), "bytes": None, "duration_s": None,
                               "manifest_sha256": None, "metric_name": None, "metric_value": None, "note": None})


def evaluated(ledger: Ledger, job_id: int, step: int, loss: float, evaluator: str = "heldout") -> None:
    ledger.evaluations.done(job_id, -1, step, evaluator, {EVAL_LOSS: loss}, time.time())
