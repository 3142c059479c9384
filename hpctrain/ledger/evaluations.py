"""The evaluations table: each evaluator's run on one checkpoint of a job's task, asked for once (again once it
failed or expired) and done by an evaluation job of its own (`hpctrain.evaluate`), its metrics or its error kept
by (job, task, step, evaluator)."""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import EvaluationRow
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

REQUESTED, SUBMITTED, DONE, FAILED, EXPIRED = "requested", "submitted", "done", "failed", "expired"
OPEN = (REQUESTED, SUBMITTED)  # not decided yet
ASK_AGAIN = (FAILED, EXPIRED)  # what a request asked again (`hpctrain eval --retry`) may replace


def _marks(values: Collection[Any]) -> str:
    return ",".join("?" * len(values))


class Evaluations:
    """Rows of `evaluations`. A request is committed (requested, with the Slurm job name it is submitted under) before
    its sbatch, linked to its ledger job in the transaction that records that job, and submitted once Slurm took it;
    its job's journal makes it done or failed, and so does its job's end without a result (`close_ended`)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[EvaluationRow] = Table(ledger, "evaluations", ("job_id", "task_index", "step", "evaluator"))

    def request(
        self,
        job_id: int,
        task_index: int,
        step: int,
        evaluator: str,
        checkpoint: str,
        key: str | None = None,
        again: Collection[str] = (),
    ) -> bool:
        """Ask for an evaluation, to be submitted under the job name ``key``: False when it was asked for before,
        unless that request is in a state of ``again`` (it is asked again then)."""
        pk = (job_id, task_index, step, evaluator)
        fresh = {
            "checkpoint": checkpoint,
            "state": REQUESTED,
            "submission_key": key,
            "eval_job_id": None,
            "metrics_json": None,
            "error": None,
            "requested_at": time.time(),
            "done_at": None,
        }
        with self.ledger.transaction():
            row = self.get(*pk)
            if row is None:
                self._rows.insert(dict(zip(("job_id", "task_index", "step", "evaluator"), pk)) | fresh)
                return True
            if row["state"] not in again:
                return False
            self._rows.update(pk, fresh)
            return True

    def linked(self, job_id: int, task_index: int, step: int, evaluator: str, eval_job_id: int) -> None:
        """The ledger job a request is submitted as, recorded before its sbatch (in the same transaction)."""
        self._rows.update((job_id, task_index, step, evaluator), {"eval_job_id": eval_job_id})

    def submitted(self, job_id: int, task_index: int, step: int, evaluator: str, eval_job_id: int) -> None:
        """Slurm took the request's job (a result already in stays)."""
        self._decide((job_id, task_index, step, evaluator), {"state": SUBMITTED, "eval_job_id": eval_job_id})

    def unsubmitted(self, job_id: int, task_index: int, step: int, evaluator: str, state: str, why: str) -> None:
        """A request whose job never reached Slurm: ``state`` failed (its submission was refused, ``why``) or expired
        (its submitter was killed before sbatch)."""
        fields = {"state": state, "error": why, "done_at": time.time()}
        self._decide((job_id, task_index, step, evaluator), fields)

    def _decide(self, pk: tuple[int, int, int, str], fields: dict[str, Any]) -> None:
        with self.ledger.transaction() as db:
            db.execute(
                f"UPDATE evaluations SET {', '.join(f'{k} = ?' for k in fields)} WHERE job_id = ? AND task_index = ? "
                "AND step = ? AND evaluator = ? AND state = ?",
                [*fields.values(), *pk, REQUESTED],
            )

    def undecided(self) -> list[EvaluationRow]:
        """Requests committed whose submission did not finish: their submitter was killed or is at it now."""
        return self._rows.rows("state = ?", [REQUESTED], order_by="requested_at")

    def close_ended(self, final: Collection[str]) -> list[tuple[int, int, int, str]]:
        """Submitted evaluations whose job has ended (a state of ``final``) without a result, its journal read since
        its end, made failed ("evaluation job 12 (slurm 345) ended TIMEOUT without a result"); a result that
        comes later still replaces it. Returns their keys."""
        sql = (
            "SELECT e.job_id, e.task_index, e.step, e.evaluator, j.id AS eval_job, j.slurm_job_id, j.state, "
            "j.ended_at FROM evaluations e JOIN jobs j ON j.id = e.eval_job_id "
            f"WHERE e.state = ? AND j.state IN ({_marks(final)}) AND j.journal_read_at >= j.ended_at"
        )
        args = [SUBMITTED, *sorted(final)]
        if not self.ledger.db.execute(sql, args).fetchone():
            return []  # the usual answer, read without taking the write lock
        with self.ledger.transaction() as db:
            closed = []
            for r in list(db.query(sql, args)):
                pk = (r["job_id"], r["task_index"], r["step"], r["evaluator"])
                why = f"evaluation job {r['eval_job']} (slurm {r['slurm_job_id']}) ended {r['state']} without a result"
                self._rows.update(pk, {"state": FAILED, "error": why, "done_at": r["ended_at"]})
                closed.append(pk)
        return closed

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

    def done_after(self, job_id: int, task_index: int, seq: int) -> list[EvaluationRow]:
        """The task's evaluations done with values that reached the ledger after ``seq``, in the order they arrived."""
        where = "job_id = ? AND task_index = ? AND state = ? AND metrics_json IS NOT NULL AND seq > ?"
        return self._rows.rows(where, [job_id, task_index, DONE, seq], order_by="seq")


def outcome(row: EvaluationRow) -> str:
    """An evaluation's values ("eval/loss 2.146, eval/bpb 3.097"), its error, or "-" while it is asked for."""
    values = json.loads(row["metrics_json"]) if row["metrics_json"] else {}
    return ", ".join(f"{k} {v:.4g}" for k, v in values.items()) or row["error"] or "-"
