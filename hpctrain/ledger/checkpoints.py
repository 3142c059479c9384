"""The checkpoints table: every checkpoint a job's tasks committed (or saw deleted by retention)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class Checkpoints:
    """Rows of `checkpoints`, one per checkpoint directory."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger

    def of_job(self, job_id: int) -> list[dict[str, Any]]:
        return self.ledger.rows("checkpoints", "job_id = ?", [job_id], order_by="task_index, step")

    def at(self, path: str) -> dict[str, Any] | None:
        found = self.ledger.rows("checkpoints", "path = ?", [path])
        return found[0] if found else None
