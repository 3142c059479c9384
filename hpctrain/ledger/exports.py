"""The tracker_exports table: for each tracker (``mlflow:<tracking URI>``, ...), the run it holds for each job's task
and how far that run was sent, so that an export sends only what is new."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hpctrain.ledger.rows import TrackerExportRow
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class TrackerExports:
    """Rows of `tracker_exports`."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[TrackerExportRow] = Table(ledger, "tracker_exports", ("tracker", "job_id", "task_index"))

    def get(self, tracker: str, job_id: int, task_index: int) -> TrackerExportRow | None:
        return self._rows.get((tracker, job_id, task_index))

    def sent(
        self,
        tracker: str,
        job_id: int,
        task_index: int,
        run_id: str,
        metrics_rowid: int,
        evaluations_at: float,
        state: str | None,
    ) -> None:
        self._rows.upsert(
            {
                "tracker": tracker,
                "job_id": job_id,
                "task_index": task_index,
                "run_id": run_id,
                "metrics_rowid": metrics_rowid,
                "evaluations_at": evaluations_at,
                "state": state,
                "exported_at": time.time(),
            }
        )

    def forget(self, tracker: str, job_id: int, task_index: int) -> None:
        """The tracker lost the run (its store was reset): the next export sends everything again."""
        self._rows.delete((tracker, job_id, task_index))
