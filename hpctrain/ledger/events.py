"""The events table: the log of what happened to jobs and sweeps (submissions, choices, requeues, journal records
with no table of their own, ...), each with its data as a JSON object."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import EventRow, LoggedEvent
from hpctrain.ledger.table import Table, ids_json

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class Events:
    """Rows of `events`, in order of time."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
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

    def start_errors(self, site: str, since: float) -> list[tuple[float, float]]:
        """For each job of the site submitted since ``since`` whose placement was chosen by its predicted start
        (`hpctrain.submit.soonest`) and that has started: how far the predicted start and Slurm's estimate were from
        its first start, in seconds (signed: later than said is positive), newest first."""
        rows = self.ledger.db.execute(
            "SELECT a.started_at - json_extract(e.data_json, '$.predicted_start'), "
            "a.started_at - json_extract(e.data_json, '$.slurm_start') "
            "FROM jobs j INDEXED BY jobs_submitted JOIN events e ON e.job_id = j.id AND e.kind = 'placement' "
            "JOIN attempts a ON a.job_id = j.id AND a.attempt = 0 "
            "AND a.task_index = CASE WHEN j.is_array THEN 0 ELSE -1 END "
            "WHERE j.site = ? AND j.submitted_at >= ? AND a.started_at IS NOT NULL "
            "AND json_extract(e.data_json, '$.predicted_start') IS NOT NULL ORDER BY j.submitted_at DESC",
            [site, since],
        )
        return [(predicted, slurm) for predicted, slurm in rows]

    def of_job(self, job_id: int) -> list[EventRow]:
        return self._rows.rows("job_id = ?", [job_id], order_by="time")

    def last(self, job_id: int, kind: str) -> LoggedEvent | None:
        """The job's latest event of ``kind``, its data decoded."""
        return self.last_of([job_id], kind).get(job_id)

    def last_of(self, job_ids: Iterable[int], kind: str) -> dict[int, LoggedEvent]:
        """Each job's latest event of ``kind`` (of those that have one), its data decoded: one statement."""
        found = self._rows.rows(
            "rowid IN (SELECT (SELECT e.rowid FROM events e WHERE e.job_id = j.value AND e.kind = ? "
            "ORDER BY e.time DESC LIMIT 1) FROM json_each(?) j)",
            [kind, ids_json(job_ids)],
        )
        return {
            job: {**r, "data": json.loads(r["data_json"] or "{}")} for r in found if (job := r["job_id"]) is not None
        }
