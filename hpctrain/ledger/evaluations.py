"""The evaluations table: each evaluator's run on one checkpoint of a job's task, asked for once and done by an
evaluation job of its own (`hpctrain.evaluate`), its metrics or its error kept by (job, task, step, evaluator)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import EvaluationRow
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

REQUESTED, DONE, FAILED = "requested", "done", "failed"


class Evaluations:
    """Rows of `evaluations`."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[EvaluationRow] = Table(ledger, "evaluations", ("job_id", "task_index", "step", "evaluator"))

    def request(self, job_id: int, task_index: int, step: int, evaluator: str, checkpoint: str) -> bool:
        """Ask for an evaluation once: False when it was asked for before (whatever became of it)."""
        with self.ledger.transaction():
            if self.get(job_id, task_index, step, evaluator) is not None:
                return False
            self._rows.insert(
                {
                    "job_id": job_id,
                    "task_index": task_index,
                    "step": step,
                    "evaluator": evaluator,
                    "checkpoint": checkpoint,
                    "state": REQUESTED,
                    "requested_at": time.time(),
                }
            )
            return True

    def submitted(self, job_id: int, task_index: int, step: int, evaluator: str, eval_job_id: int) -> None:
        self._rows.update((job_id, task_index, step, evaluator), {"eval_job_id": eval_job_id})

    def withdraw(self, job_id: int, task_index: int, step: int, evaluator: str) -> None:
        """Forget a request whose job could not be submitted, so that a later call asks again."""
        self._rows.delete((job_id, task_index, step, evaluator))

    def done(
        self, job_id: int, task_index: int, step: int, evaluator: str, metrics: Mapping[str, float], at: float
    ) -> None:
        """The evaluator's values (a result reported again replaces the one before: an evaluation job requeued
        after it reported runs again)."""
        self._finish(
            job_id,
            task_index,
            step,
            evaluator,
            {"state": DONE, "metrics_json": dict(metrics), "error": None, "done_at": at},
        )

    def failed(self, job_id: int, task_index: int, step: int, evaluator: str, error: str, at: float) -> None:
        self._finish(
            job_id, task_index, step, evaluator, {"state": FAILED, "metrics_json": None, "error": error, "done_at": at}
        )

    def _finish(self, job_id: int, task_index: int, step: int, evaluator: str, fields: dict[str, Any]) -> None:
        with self.ledger.transaction():
            if self.get(job_id, task_index, step, evaluator) is None:  # run by hand, not through `hpctrain eval`
                self._rows.insert(
                    {
                        "job_id": job_id,
                        "task_index": task_index,
                        "step": step,
                        "evaluator": evaluator,
                        "checkpoint": "",
                        "state": REQUESTED,
                        "requested_at": fields["done_at"],
                    }
                )
            self._rows.update((job_id, task_index, step, evaluator), fields)

    def get(self, job_id: int, task_index: int, step: int, evaluator: str) -> EvaluationRow | None:
        return self._rows.get((job_id, task_index, step, evaluator))

    def of_checkpoint(self, path: str) -> list[EvaluationRow]:
        """The evaluations asked for of the checkpoint directory ``path`` (as `hpctrain eval` named it)."""
        return self._rows.rows("checkpoint = ?", [path], order_by="evaluator")

    def of_job(self, job_id: int) -> list[EvaluationRow]:
        return self._rows.rows("job_id = ?", [job_id], order_by="task_index, step, evaluator")


def outcome(row: EvaluationRow) -> str:
    """An evaluation's values ("eval/loss 2.146, eval/bpb 3.097"), its error, or "-" while it is asked for."""
    values = json.loads(row["metrics_json"]) if row["metrics_json"] else {}
    return ", ".join(f"{k} {v:.4g}" for k, v in values.items()) or row["error"] or "-"
