"""The segments table: each start of a job step within a run (the first, then each in-allocation restart),
with what its trainer journaled: when it started and had loaded its checkpoint, the step it resumed from,
its steps so far (count, last one, summed step time), and whether its watchdog found it hung. Goodput
accounting reads it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

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

    def started(
        self,
        key: dict[str, int],
        *,
        main_at: float | None,
        loaded_at: float | None,
        resumed_from: int,
        tier: str | None,
    ) -> None:
        """A trainer's start-up: process start, checkpoint loaded, the step it resumed from and the tier."""
        self.ledger.upsert(
            "segments",
            {**key, "main_at": main_at, "loaded_at": loaded_at, "resumed_from": resumed_from, "tier": tier},
            pk=PK,
        )

    def stepped(self, key: dict[str, int], *, step: int, seconds: float, time: float) -> None:
        """One training step done (each journaled step is ingested once)."""
        with self.ledger.transaction() as db:
            db.execute(_STEP_SQL, {**key, "step": step, "seconds": seconds, "time": time})

    def hung(self, key: dict[str, int]) -> None:
        self.ledger.upsert("segments", {**key, "hung": 1}, pk=PK)

    def of_jobs(self, job_ids: Iterable[int]) -> list[dict[str, Any]]:
        ids = sorted(set(job_ids))
        return self.ledger.rows(
            "segments",
            f"job_id IN ({','.join('?' * len(ids))})",
            ids,
            order_by="job_id, task_index, attempt, step_restart",
        )
