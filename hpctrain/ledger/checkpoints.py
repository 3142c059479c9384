"""The checkpoints table: every checkpoint a job's tasks committed (or saw deleted by retention)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpctrain.ledger.rows import CheckpointRow, NewCheckpoint
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class Checkpoints:
    """Rows of `checkpoints`, one per checkpoint directory."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[CheckpointRow] = Table(ledger, "checkpoints")

    def record(self, checkpoint: NewCheckpoint) -> None:
        """A checkpoint as its job journaled it: a new one, or a later state (deleted, corrupt) of one known, whose
        creation time stays its commit's and whose other columns keep what the new record does not say."""
        with self.ledger.transaction():
            existing = self.at(checkpoint["path"])
            if existing:
                changed = {k: v for k, v in checkpoint.items() if v is not None and k != "created_at"}
                self._rows.update(existing["id"], changed)
            else:
                self._rows.insert(checkpoint)

    def of_job(self, job_id: int) -> list[CheckpointRow]:
        return self._rows.rows("job_id = ?", [job_id], order_by="task_index, step")

    def newest(self, job_id: int, limit: int) -> list[CheckpointRow]:
        """The job's ``limit`` newest checkpoints by commit time (any task, any state: each was committed)."""
        return self._rows.rows("job_id = ?", [job_id], order_by="created_at DESC", limit=limit)

    def at(self, path: str) -> CheckpointRow | None:
        return self._rows.first("path = ?", [path])
