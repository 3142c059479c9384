"""The tracker_exports table: for each tracker (``mlflow:<tracking URI>``, ...), the run it holds for each job's task
and how far that run was sent (in the ledger's order of arrival, `seq`); and the ledger's own id, which keys the runs
it makes in a tracker so that an export finds them again."""

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

    def ledger_id(self) -> str:
        """This ledger's id (made with it, kept by copies of the file)."""
        return str(self.ledger.db.execute("SELECT id FROM ledger_info").fetchone()[0])

    def get(self, tracker: str, job_id: int, task_index: int) -> TrackerExportRow | None:
        return self._rows.get((tracker, job_id, task_index))

    def sent(self, tracker: str, job_id: int, task_index: int, run_id: str, sent_seq: int, state: str | None) -> None:
        """The tracker holds the task as run ``run_id``, with its values up to ``sent_seq`` and its ``state``."""
        self._rows.upsert(
            {
                "tracker": tracker,
                "job_id": job_id,
                "task_index": task_index,
                "run_id": run_id,
                "sent_seq": sent_seq,
                "state": state,
                "exported_at": time.time(),
            }
        )
