"""The sweeps and trials tables: a sweep's row and state, and each trial's parameters, state, value and the
array task that runs it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from hpctrain.ledger.rows import SweepRow, TrialRow, TrialSummary, TrialTask
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

FINISHED = ("completed", "failed", "pruned")

_WITH_TASKS_SQL = """
SELECT tr.number, tr.params_json, tr.state AS trial_state, tr.job_id, tr.task_index, tr.failures, tr.value,
       j.slurm_job_id, j.state = 'SUBMIT_FAILED' AS unsent, t.state AS task_state
FROM trials tr LEFT JOIN jobs j ON j.id = tr.job_id
LEFT JOIN array_tasks t ON t.job_id = tr.job_id AND t.task_index = tr.task_index
WHERE tr.sweep_id = ? ORDER BY tr.number
"""
# The metric's last reported value per trial (the value of a finished trial).
_FINAL_SQL = """
SELECT tr.number, m.value FROM trials tr JOIN metrics m ON m.job_id = tr.job_id AND m.task_index = tr.task_index
WHERE tr.sweep_id = ? AND m.name = ? AND m.step = (SELECT max(step) FROM metrics m2 WHERE m2.job_id = m.job_id
      AND m2.task_index = m.task_index AND m2.name = m.name)
"""
_TABLE_SQL = """
SELECT tr.number, tr.params_json, tr.state, tr.value, tr.failures, tr.reason, j.slurm_job_id, tr.task_index,
       (SELECT sum(coalesce(a.gpu_s, a.alloc_gpus * (coalesce(a.ended_at, :now) - a.started_at))) / 3600.0 FROM attempts a
        WHERE a.job_id = tr.job_id AND a.task_index = tr.task_index AND a.started_at IS NOT NULL) AS gpu_hours
FROM trials tr LEFT JOIN jobs j ON j.id = tr.job_id WHERE tr.sweep_id = :sweep ORDER BY tr.number
"""


class Sweeps:
    """Rows of `sweeps` (keyed by name) and of `trials` (keyed by sweep and trial number)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[SweepRow] = Table(ledger, "sweeps")
        self._trials: Table[TrialRow] = Table(ledger, "trials", ("sweep_id", "number"))

    def get(self, sweep_id: str) -> SweepRow | None:
        return self._rows.get(sweep_id)

    def create(self, sweep_id: str, method: str, spec_json: str) -> None:
        now = time.time()
        self._rows.insert(
            {
                "id": sweep_id,
                "name": sweep_id,
                "method": method,
                "state": "ACTIVE",
                "spec_json": spec_json,
                "created_at": now,
                "updated_at": now,
            },
        )

    def set_state(self, sweep_id: str, state: str) -> None:
        """ACTIVE, DONE, FAILED (its tick failed on its own account) or CANCELLED."""
        self._rows.update(sweep_id, {"state": state, "updated_at": time.time()})

    def active(self) -> list[str]:
        """Ids of the sweeps a tick works on, oldest first."""
        return [r["id"] for r in self._rows.rows("state = 'ACTIVE'", order_by="created_at")]

    # Trials.

    def trials_with_tasks(self, sweep_id: str) -> list[TrialTask]:
        """Every trial with its task's state and whether its job's sbatch failed ("unsent")."""
        return cast("list[TrialTask]", list(self.ledger.db.query(_WITH_TASKS_SQL, [sweep_id])))

    def final_values(self, sweep_id: str, metric: str) -> dict[int, float]:
        return dict(self.ledger.db.execute(_FINAL_SQL, [sweep_id, metric]).fetchall())

    def curves(self, sweep_id: str, metric: str, numbers: list[int]) -> dict[int, dict[int, float]]:
        """The metric by step for these trials."""
        out: dict[int, dict[int, float]] = {n: {} for n in numbers}
        if numbers:
            for number, step, value in self.ledger.db.execute(
                "SELECT tr.number, m.step, m.value FROM trials tr JOIN metrics m ON m.job_id = tr.job_id "
                "AND m.task_index = tr.task_index WHERE tr.sweep_id = ? AND m.name = ? AND tr.number IN "
                f"({','.join('?' * len(numbers))})",
                [sweep_id, metric, *numbers],
            ):
                out[number][step] = value
        return out

    def table(self, sweep_id: str) -> list[TrialSummary]:
        """Every trial with its parameters (JSON), state, value and GPU-hours so far (one query)."""
        return cast(
            "list[TrialSummary]", list(self.ledger.db.query(_TABLE_SQL, {"now": time.time(), "sweep": sweep_id}))
        )

    def new_trials(self, sweep_id: str) -> list[TrialRow]:
        """Trials suggested and not yet submitted, by number."""
        return self._trials.rows("sweep_id = ? AND state = 'new'", [sweep_id], order_by="number")

    def add_trials(self, sweep_id: str, first: int, params: Iterable[Mapping[str, Any]]) -> None:
        """New trials numbered from ``first``, each with its parameters."""
        now = time.time()
        self._trials.insert_all(
            {
                "sweep_id": sweep_id,
                "number": first + i,
                "params_json": json.dumps(p, sort_keys=True),
                "state": "new",
                "failures": 0,
                "updated_at": now,
            }
            for i, p in enumerate(params)
        )

    def set_outcomes(self, sweep_id: str, outcomes: Iterable[tuple[int, str, float | None]]) -> None:
        """(number, state, value) of trials whose state or value changed."""
        rows = [(state, value, time.time(), sweep_id, n) for n, state, value in outcomes]
        if rows:
            with self.ledger.transaction() as db:
                db.conn.executemany(
                    "UPDATE trials SET state = ?, value = ?, updated_at = ? WHERE sweep_id = ? AND number = ?", rows
                )

    def unlink(self, sweep_id: str, numbers: Iterable[int], failed: bool = False) -> None:
        """Trials back to "new", to be submitted again; ``failed`` counts it against the trial's retries (an
        sbatch that failed is not the trial's failure)."""
        rows = [(int(failed), time.time(), sweep_id, n) for n in numbers]
        if rows:
            with self.ledger.transaction() as db:
                db.conn.executemany(
                    "UPDATE trials SET state = 'new', failures = failures + ?, job_id = NULL, "
                    "task_index = NULL, updated_at = ? WHERE sweep_id = ? AND number = ?",
                    rows,
                )

    def prune(self, sweep_id: str, number: int, reason: str) -> None:
        with self.ledger.transaction() as db:
            db.execute(
                "UPDATE trials SET state = 'pruned', reason = ?, updated_at = ? WHERE sweep_id = ? AND number = ?",
                [reason, time.time(), sweep_id, number],
            )

    def link(self, sweep_id: str, job_id: int, numbers_by_task: Iterable[tuple[int, int]]) -> None:
        """Each (task index, trial number) of a job just recorded: the trial is pending in that task."""
        now = time.time()
        with self.ledger.transaction() as db:
            db.conn.executemany(
                "UPDATE trials SET state = 'pending', job_id = ?, task_index = ?, updated_at = ? "
                "WHERE sweep_id = ? AND number = ?",
                [(job_id, task, now, sweep_id, number) for task, number in numbers_by_task],
            )

    def counts(self, sweep_id: str) -> tuple[int, int]:
        """(finished trials, unfinished trials)."""
        done = dict(
            self.ledger.db.execute(
                f"SELECT state IN ({','.join('?' * len(FINISHED))}), count(*) FROM trials WHERE sweep_id = ? GROUP BY 1",
                [*FINISHED, sweep_id],
            ).fetchall()
        )
        return done.get(1, 0), done.get(0, 0)
