"""The checkpoints table: every checkpoint a job's tasks committed (or saw deleted by retention)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hpctrain.ledger.rows import CheckpointRow, NewCheckpoint
from hpctrain.ledger.table import Table, ids_json

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

    def newest_of(self, job_ids: Iterable[int], limit: int) -> dict[int, list[CheckpointRow]]:
        """Each job's ``limit`` newest checkpoints by commit time, newest first (any task, any state: each was
        committed), of the jobs that have any: one statement."""
        found: dict[int, list[CheckpointRow]] = {}
        for row in self._rows.rows(
            "rowid IN (SELECT c.rowid FROM json_each(?) j JOIN checkpoints c ON c.rowid IN (SELECT rowid FROM "
            "checkpoints WHERE job_id = j.value ORDER BY created_at DESC LIMIT ?))",
            [ids_json(job_ids), limit],
            order_by="job_id, created_at DESC",
        ):
            if (job_id := row["job_id"]) is not None:  # always: the rows are of these jobs
                found.setdefault(job_id, []).append(row)
        return found

    def at(self, path: str) -> CheckpointRow | None:
        return self._rows.first("path = ?", [path])
