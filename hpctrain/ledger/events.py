"""The events table: the log of what happened to jobs and sweeps (submissions, choices, requeues, journal records
with no table of their own, ...), each with its data as a JSON object."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import EventRow, LoggedEvent
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class Events:
    """Rows of `events`, in order of time."""

    def __init__(self, ledger: Ledger):
        self._rows: Table[EventRow] = Table(ledger, "events")

    def add(
        self,
        kind: str,
        message: str = "",
        job_id: int | None = None,
        data: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> int:
        """Append one event (at ``at``, else now); returns its id."""
        return self._rows.insert(
            {
                "time": time.time() if at is None else at,
                "kind": kind,
                "job_id": job_id,
                "message": message,
                "data_json": data or None,
            }
        )

    def of_job(self, job_id: int) -> list[EventRow]:
        return self._rows.rows("job_id = ?", [job_id], order_by="time")

    def last(self, job_id: int, kind: str) -> LoggedEvent | None:
        """The job's latest event of ``kind``, its data decoded."""
        found = self._rows.first("job_id = ? AND kind = ?", [job_id, kind], order_by="time DESC")
        return {**found, "data": json.loads(found["data_json"] or "{}")} if found else None
