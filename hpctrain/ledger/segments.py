"""The segments table: each start of a job step within a run (the first, then each in-allocation restart),
with what its trainer journaled: when it started and had loaded its checkpoint, the step it resumed from,
its steps so far (count, last one, summed step time), and whether its watchdog found it hung. Goodput
accounting reads it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hpctrain.ledger.rows import SegmentKey, SegmentRow
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

PK = ("job_id", "task_index", "attempt", "step_restart")

_STEP_SQL = """
INSERT INTO segments (job_id, task_index, attempt, step_restart, steps, step_seconds, last_step, last_step_at)
VALUES (:job_id, :task_index, :attempt, :step_restart, 1, :seconds, :step, :time)
ON CONFLICT (job_id, task_index, attempt, step_restart) DO UPDATE SET
    steps = steps + 1, step_seconds = step_seconds + :seconds,
    last_step = max(coalesce(last_step, :step), :step), last_step_at = max(coalesce(last_step_at, :time), :time)
"""


class Segments:
    """Rows of `segments`, keyed by (job id, task index, run number, step restart)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[SegmentRow] = Table(ledger, "segments", PK)

    def started(
        self,
        key: SegmentKey,
        *,
        main_at: float | None,
        loaded_at: float | None,
        resumed_from: int,
        tier: str | None,
    ) -> None:
        """A trainer's start-up: process start, checkpoint loaded, the step it resumed from and the tier."""
        self._rows.upsert(
            {**key, "main_at": main_at, "loaded_at": loaded_at, "resumed_from": resumed_from, "tier": tier}
        )

    def stepped(self, key: SegmentKey, *, step: int, seconds: float, time: float) -> None:
        """One training step done (each journaled step is ingested once)."""
        with self.ledger.transaction() as db:
            db.execute(_STEP_SQL, {**key, "step": step, "seconds": seconds, "time": time})

    def hung(self, key: SegmentKey) -> None:
        self._rows.upsert({**key, "hung": 1})

    def of_jobs(self, job_ids: Iterable[int]) -> list[SegmentRow]:
        ids = sorted(set(job_ids))
        return self._rows.rows(
            f"job_id IN ({','.join('?' * len(ids))})",
            ids,
            order_by="job_id, task_index, attempt, step_restart",
        )
