"""The `gpu_use` and `gpu_timeline` tables: how busy each GPU of a job was, as the nodes' samplers journal it
(hpctrain.runtime.utilization): per job step start, node and GPU the newest summary, and a row a node and
minute."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import GpuPoint, GpuUseRow, SegmentKey
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

IN_CHUNK = 900  # job ids bound in one query: under SQLite's oldest limit of variables (999)
SUMMARY = (
    "samples",
    "seconds",
    "mean",
    "p10",
    "mem_peak",
    "mem_total",
    "energy_j",
    "idle_s",
    "idle_now_s",
    "below_percent",
    "after_s",
    "alert_s",
)
_USE_SQL = f"""
INSERT INTO gpu_use (job_id, task_index, attempt, step_restart, node, device, kind, {", ".join(SUMMARY)}, at, final)
VALUES (:job_id, :task_index, :attempt, :step_restart, :node, :device, :kind, {", ".join(":" + c for c in SUMMARY)},
        :at, :final)
ON CONFLICT (job_id, task_index, attempt, step_restart, node, device) DO UPDATE SET
    kind = excluded.kind, {", ".join(f"{c} = excluded.{c}" for c in SUMMARY)}, at = excluded.at,
    final = excluded.final
WHERE excluded.seconds >= gpu_use.seconds
"""


# A minute's GPUs may come in two records (a GPU's point closed at the step's end): merged.
_MINUTE_SQL = """
INSERT INTO gpu_timeline (job_id, at, task_index, node, util, mem) VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (job_id, at, task_index, node) DO UPDATE SET
    util = json_patch(util, excluded.util), mem = json_patch(mem, excluded.mem)
"""


class Gpus:
    """Rows of `gpu_use` and `gpu_timeline`."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._use: Table[GpuUseRow] = Table(ledger, "gpu_use")
        self._timeline: Table[GpuPoint] = Table(ledger, "gpu_timeline")

    def record(
        self,
        key: SegmentKey,
        node: str,
        kind: str,
        gpus: Mapping[str, Mapping[str, Any]],
        policy: Mapping[str, float],
        timeline: Iterable[tuple[float, str, float, float | None]],
        at: float,
        final: bool,
    ) -> None:
        """One sampler record: each GPU's summary so far and the policy it counted idleness by (an older one than the
        row's is ignored), its new minutes."""
        with self.ledger.transaction() as db:
            for device, summary in gpus.items():
                row = {c: {**summary, **policy}.get(c) for c in SUMMARY}
                row.update(
                    samples=row["samples"] or 0,
                    seconds=row["seconds"] or 0.0,
                    idle_s=row["idle_s"] or 0.0,
                    idle_now_s=row["idle_now_s"] or 0.0,
                )
                db.execute(
                    _USE_SQL,
                    {**key, **row, "node": node, "device": device, "kind": kind, "at": at, "final": int(final)},
                )
            minutes: dict[float, tuple[dict[str, int], dict[str, int]]] = {}
            for start, device, util, mem in timeline:
                util_of, mem_of = minutes.setdefault(start, ({}, {}))
                util_of[device] = round(util)
                if mem is not None:
                    mem_of[device] = round(mem / 2**20)
            db.conn.executemany(
                _MINUTE_SQL,
                [
                    (key["job_id"], start, key["task_index"], node, json.dumps(util_of), json.dumps(mem_of))
                    for start, (util_of, mem_of) in minutes.items()
                ],
            )

    def thin(self, job_ids: Iterable[int], most: int) -> int:
        """Thin the timelines of these (settled) jobs to at most ``most`` rows a task and node: each run of
        consecutive minutes merged into one at its first minute, each GPU's mean of their percents and peak of their
        memory. A long run's timeline stays a plot's worth, not a row a minute. How many rows went."""
        ids = sorted(set(job_ids))
        if not ids:
            return 0
        long = self.ledger.db.execute(
            f"SELECT job_id, task_index, node, count(*) FROM gpu_timeline WHERE job_id IN ({','.join('?' * len(ids))}) "
            "GROUP BY 1, 2, 3 HAVING count(*) > ?",
            [*ids, most],
        ).fetchall()
        gone = 0
        with self.ledger.transaction() as db:
            for job_id, task_index, node, count in long:
                key = (job_id, task_index, node)
                rows = db.execute(
                    "SELECT at, util, mem FROM gpu_timeline WHERE job_id = ? AND task_index = ? AND node = ? "
                    "ORDER BY at",
                    key,
                ).fetchall()
                width = -(-count // most)
                merged = [_merged(rows[i : i + width]) for i in range(0, count, width)]
                db.execute("DELETE FROM gpu_timeline WHERE job_id = ? AND task_index = ? AND node = ?", key)
                db.conn.executemany(
                    "INSERT INTO gpu_timeline (job_id, at, task_index, node, util, mem) VALUES (?, ?, ?, ?, ?, ?)",
                    [(job_id, at, task_index, node, util, mem) for at, util, mem in merged],
                )
                gone += count - len(merged)
        return gone

    def of_job(self, job_id: int) -> list[GpuUseRow]:
        """Every GPU summary of the job, oldest run first."""
        return self._use.rows("job_id = ?", [job_id], "task_index, attempt, step_restart, node, device")

    def of_jobs(self, job_ids: Iterable[int]) -> list[GpuUseRow]:
        ids = sorted(set(job_ids))
        if not ids:
            return []
        return self._use.rows(f"job_id IN ({','.join('?' * len(ids))})", ids, "job_id, attempt, step_restart")

    def means(self, job_ids: Iterable[int]) -> dict[tuple[int, int], float]:
        """Each (job, task)'s mean GPU utilization over every GPU and run sampled, weighted by the time sampled."""
        ids = sorted(set(job_ids))
        rows = self.ledger.db.execute(
            f"SELECT job_id, task_index, total(mean * seconds) / total(seconds) FROM gpu_use "
            f"WHERE job_id IN ({','.join('?' * len(ids))}) AND mean IS NOT NULL AND seconds > 0 GROUP BY 1, 2",
            ids,
        )
        return {(job_id, task): mean for job_id, task, mean in rows}

    def idle_seconds(self, job_ids: Iterable[int], since: float = 0.0) -> dict[int, float]:
        """Each job's GPU-seconds held idle, summed over its GPUs and runs last sampled at ``since`` or later."""
        ids = sorted(set(job_ids))
        out: dict[int, float] = {}
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            out.update(
                self.ledger.db.execute(
                    f"SELECT job_id, total(idle_s) FROM gpu_use WHERE job_id IN ({','.join('?' * len(chunk))}) "
                    "AND at >= ? GROUP BY job_id",
                    [*chunk, since],
                ).fetchall()
            )
        return out

    def recent(self, job_ids: Iterable[int], since: float) -> dict[int, tuple[float, float]]:
        """Each job's mean utilization over its timeline's minutes from ``since`` on, and its first such minute."""
        ids = sorted(set(job_ids))
        rows = self.ledger.db.execute(
            f"SELECT job_id, avg(u.value), min(at) FROM gpu_timeline, json_each(util) AS u "
            f"WHERE job_id IN ({','.join('?' * len(ids))}) AND at >= ? GROUP BY job_id",
            [*ids, since],
        )
        return {job_id: (mean, first) for job_id, mean, first in rows}

    def timeline(self, job_id: int) -> list[GpuMinute]:
        """The job's minutes, in order of time: per task and node, each GPU's percent and peak MiB."""
        return [
            GpuMinute(r["at"], r["task_index"], r["node"], json.loads(r["util"]), json.loads(r["mem"]))
            for r in self._timeline.rows("job_id = ?", [job_id], "at, task_index, node")
        ]


def _merged(rows: list[tuple[float, str, str]]) -> tuple[float, str, str]:
    """Consecutive timeline rows (at, util JSON, mem JSON) as one: at the first's minute, each GPU's mean percent
    and peak MiB."""
    utils: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    for _, util, mem in rows:
        for device, percent in json.loads(util).items():
            utils.setdefault(device, []).append(percent)
        for device, mib in json.loads(mem).items():
            peaks[device] = max(peaks.get(device, mib), mib)
    util_of = {device: round(sum(values) / len(values)) for device, values in utils.items()}
    return rows[0][0], json.dumps(util_of), json.dumps(peaks)


@dataclass(frozen=True)
class GpuMinute:
    """From ``at`` (a minute; more once the job's timeline was thinned) one node's GPUs: each one's mean
    utilization (percent) and peak memory (MiB), by GPU."""

    at: float
    task_index: int
    node: str
    util: dict[str, float]
    mem: dict[str, float]
