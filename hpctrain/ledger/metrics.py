"""The metrics table: one value per (job, task, metric name, step), as trainers journal them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import MetricRow, MetricSummary
from hpctrain.ledger.table import Table, ids_json

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

# Mean data wait over mean step time across the latest steps that report both, of the task that reported last (a
# plain job's only task): read through the primary key, so the cost is the steps asked for, whatever the history.
_DATA_WAIT_SQL = """
SELECT j.value, (SELECT avg(w.value) / avg(s.value) FROM (
    SELECT job_id, task_index, step, value FROM metrics
    WHERE job_id = j.value AND name = 'step_time_s' AND task_index = (
        SELECT task_index FROM metric_tails WHERE job_id = j.value ORDER BY last_at DESC LIMIT 1)
    ORDER BY step DESC LIMIT :steps) s
  JOIN metrics w ON w.job_id = s.job_id AND w.task_index = s.task_index AND w.step = s.step AND w.name = 'data_wait_s')
FROM json_each(:jobs) j
"""


class Metrics:
    """Rows of `metrics`."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[MetricRow] = Table(ledger, "metrics", ("job_id", "task_index", "name", "step"))

    def record(
        self, job_id: int, task_index: int, step: int, values: Mapping[str, float | None], restart: int, at: float
    ) -> None:
        """A task's values at one step, reported at ``at`` in its ``restart``-th restart (column ``attempt``); a value
        reported again replaces the one before."""
        self._rows.upsert_all(
            {
                "job_id": job_id,
                "task_index": task_index,
                "name": name,
                "step": step,
                "value": value,
                "attempt": restart,
                "time": at,
            }
            for name, value in values.items()
        )

    def of_job(self, job_id: int, task_index: int | None = None, names: tuple[str, ...] = ()) -> list[MetricRow]:
        """A job's values (of one task, of some names), by task, step and name."""
        where = "job_id = ?"
        args: list[object] = [job_id]
        if task_index is not None:
            where, args = where + " AND task_index = ?", args + [task_index]
        if names:
            where, args = where + f" AND name IN ({','.join('?' * len(names))})", args + list(names)
        return self._rows.rows(where, args, order_by="task_index, step, name")

    def tail(
        self, job_id: int, steps: int, task_index: int | None = None, names: tuple[str, ...] = ()
    ) -> list[MetricRow]:
        """`of_job`'s rows at its last ``steps`` (task, step) pairs, reading at most ``steps`` rows of each series
        (task and metric name): a (task, step) among the last ``steps`` overall is among its series' last ``steps``."""
        rows: list[MetricRow] = []
        for task, name in self.series(job_id):
            if task_index in (None, task) and (not names or name in names):
                where, args = "job_id = ? AND task_index = ? AND name = ?", [job_id, task, name]
                rows += self._rows.rows(where, args, order_by="step DESC", limit=steps)
        last = set(sorted({(r["task_index"], r["step"]) for r in rows})[-steps:])
        return sorted(
            (r for r in rows if (r["task_index"], r["step"]) in last), key=lambda r: (r["task_index"], r["step"])
        )

    def series(self, job_id: int) -> list[tuple[int, str]]:
        """(task index, metric name) of each series the job reported, one primary-key seek each (a skip scan)."""

        def first(sql: str, *args: object) -> Any:
            return self.ledger.db.execute(f"SELECT min({sql}", [job_id, *args]).fetchone()[0]

        found: list[tuple[int, str]] = []
        task = first("task_index) FROM metrics WHERE job_id = ?")
        while task is not None:
            name = first("name) FROM metrics WHERE job_id = ? AND task_index = ?", task)
            while name is not None:
                found.append((task, name))
                name = first("name) FROM metrics WHERE job_id = ? AND task_index = ? AND name > ?", task, name)
            task = first("task_index) FROM metrics WHERE job_id = ? AND task_index > ?", task)
        return found

    def after(self, job_id: int, task_index: int, seq: int) -> list[tuple[int, str, int, float, float | None]]:
        """(seq, name, step, value, time) of the task's values that reached the ledger after ``seq`` (a recomputed
        step's new value comes again), in the order they arrived."""
        return list(
            self.ledger.db.execute(
                "SELECT seq, name, step, value, time FROM metrics INDEXED BY metrics_seq WHERE job_id = ? "
                "AND task_index = ? AND seq > ? AND value IS NOT NULL ORDER BY seq",
                [job_id, task_index, seq],
            )
        )

    def points(self, job_id: int, most: int | None = None) -> Iterator[tuple[str, int, int, float]]:
        """(name, task, step, value) of every reported value, by task, name and step. With ``most``, a series of more
        than ``most`` values gives what a plot can show of it, chosen in SQL: of each of ``most // 2`` equal ranges
        of its steps the lowest and the highest value (at their own steps, so that a spike stays), and its first
        and last values (a report's facts)."""
        for task, name in self.series(job_id):
            for step, value in self._series_points(job_id, task, name, most):
                yield name, task, step, value

    def _series_points(self, job_id: int, task: int, name: str, most: int | None) -> list[tuple[int, float]]:
        series, args = "job_id = ? AND task_index = ? AND name = ?", [job_id, task, name]
        key = series + " AND value IS NOT NULL"
        db = self.ledger.db
        # counted on the primary key alone (its values unread): a bound a little high where some are NULL
        if most is not None and db.execute(f"SELECT count(*) FROM metrics WHERE {series}", args).fetchone()[0] > most:
            lo, hi = db.execute(f"SELECT min(step), max(step) FROM metrics WHERE {key}", args).fetchone()
            width = -(-(hi - lo + 1) // max(1, most // 2))
            picked: dict[int, float] = {}
            # a range at a time, each an index range (a GROUP BY on the range sorted every value first: 1.5x the time);
            # SQLite gives the bare column `step` the row of the min() or max()
            for first in range(lo, hi + 1, width):
                for extreme in ("min", "max"):
                    step, value = db.execute(
                        f"SELECT step, {extreme}(value) FROM metrics WHERE {key} AND step BETWEEN ? AND ?",
                        [*args, first, first + width - 1],
                    ).fetchone()
                    if step is not None:  # a range with no value: gaps in the steps
                        picked[step] = value
            for end in (lo, hi):
                picked.update(db.execute(f"SELECT step, value FROM metrics WHERE {key} AND step = ?", [*args, end]))
            return sorted(picked.items())
        return db.execute(f"SELECT step, value FROM metrics WHERE {key} ORDER BY step", args).fetchall()

    def summary(self, job_id: int, task_index: int, lower_is_better: Mapping[str, bool]) -> dict[str, MetricSummary]:
        """Per metric name of a run (a job's task, -1 for a plain job): its last step and value, and its best value
        (the lowest, or the highest where ``lower_is_better`` says False) with its step. One pass over each name's
        values (SQLite gives a bare column the row of the min() or max() beside it) and one index seek for its
        last step."""
        found: dict[str, MetricSummary] = {}
        for lower in (True, False):
            names = [n for n, low in lower_is_better.items() if low is lower]
            if not names:
                continue
            rows = self.ledger.db.execute(
                f"SELECT name, {'min' if lower else 'max'}(value), step, count(*) FROM metrics WHERE job_id = ? AND "
                f"task_index = ? AND name IN ({','.join('?' * len(names))}) AND value IS NOT NULL GROUP BY name",
                [job_id, task_index, *names],
            )
            for name, best, best_step, points in rows.fetchall():
                last_step, last = self.ledger.db.execute(
                    "SELECT step, value FROM metrics WHERE job_id = ? AND task_index = ? AND name = ? "
                    "AND value IS NOT NULL ORDER BY step DESC LIMIT 1",
                    [job_id, task_index, name],
                ).fetchone()
                found[name] = {
                    "last_step": last_step,
                    "last": last,
                    "best_step": best_step,
                    "best": best,
                    "points": points,
                }
        return found

    def last_values(self, job_id: int, names: tuple[str, ...], task_index: int | None = None) -> dict[str, float]:
        """The newest value of each of ``names`` that task ``task_index`` (default: the one that reported last) has,
        by name (an index seek each)."""
        db, found = self.ledger.db, {}
        task = (
            (task_index,)
            if task_index is not None
            else db.execute(
                "SELECT task_index FROM metric_tails WHERE job_id = ? ORDER BY last_at DESC LIMIT 1", [job_id]
            ).fetchone()
        )
        for name in names if task is not None else ():
            row = db.execute(
                "SELECT value FROM metrics WHERE job_id = ? AND task_index = ? AND name = ? AND value IS NOT NULL "
                "ORDER BY step DESC LIMIT 1",
                [job_id, task[0], name],
            ).fetchone()
            if row is not None:
                found[name] = row[0]
        return found

    def last_times(self, job_ids: Iterable[int]) -> dict[int, float]:
        """When each job last reported a metric (a training step), from its tasks' tails; jobs that never did are
        left out. One statement."""
        rows = self.ledger.db.execute(
            "SELECT j.value, (SELECT max(last_at) FROM metric_tails WHERE job_id = j.value) FROM json_each(?) j",
            [ids_json(job_ids)],
        )
        return {job_id: last for job_id, last in rows if last is not None}

    def data_wait_fractions(self, job_ids: Iterable[int], steps: int) -> dict[int, float]:
        """Each job's part of step time spent waiting for data over the last ``steps`` steps reporting both (of the
        task that reported last); jobs without such steps are left out. One statement."""
        rows = self.ledger.db.execute(_DATA_WAIT_SQL, {"jobs": ids_json(job_ids), "steps": steps})
        return {job_id: wait for job_id, wait in rows if wait is not None}
