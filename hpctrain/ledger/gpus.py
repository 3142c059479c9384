"""The `gpu_use` and `gpu_timeline` tables: how busy each GPU of a job was, as the nodes' samplers journal it
(hpctrain.runtime.utilization): per job step start, node and GPU the newest summary, and one point a minute."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import GpuPoint, GpuUseRow, SegmentKey
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

SUMMARY = ("samples", "seconds", "mean", "p10", "mem_peak", "mem_total", "energy_j", "idle_s", "idle_now_s")
_USE_SQL = f"""
INSERT INTO gpu_use (job_id, task_index, attempt, step_restart, node, device, kind, {", ".join(SUMMARY)}, at, final)
VALUES (:job_id, :task_index, :attempt, :step_restart, :node, :device, :kind, {", ".join(":" + c for c in SUMMARY)},
        :at, :final)
ON CONFLICT (job_id, task_index, attempt, step_restart, node, device) DO UPDATE SET
    kind = excluded.kind, {", ".join(f"{c} = excluded.{c}" for c in SUMMARY)}, at = excluded.at,
    final = excluded.final
WHERE excluded.seconds >= gpu_use.seconds
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
        timeline: Iterable[tuple[float, str, float, float | None]],
        at: float,
        final: bool,
    ) -> None:
        """One sampler record: each GPU's summary so far (an older one than the row's is ignored), its new minutes."""
        with self.ledger.transaction() as db:
            for device, summary in gpus.items():
                row = {c: summary.get(c) for c in SUMMARY}
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
            db.conn.executemany(
                "INSERT OR REPLACE INTO gpu_timeline VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (key["job_id"], key["task_index"], node, device, start, util, mem)
                    for start, device, util, mem in timeline
                ],
            )

    def of_job(self, job_id: int) -> list[GpuUseRow]:
        """Every GPU summary of the job, oldest run first."""
        return self._use.rows("job_id = ?", [job_id], "task_index, attempt, step_restart, node, device")

    def of_jobs(self, job_ids: Iterable[int]) -> list[GpuUseRow]:
        ids = sorted(set(job_ids))
        if not ids:
            return []
        return self._use.rows(f"job_id IN ({','.join('?' * len(ids))})", ids, "job_id, attempt, step_restart")

    def timeline(self, job_id: int, task_index: int | None = None) -> list[GpuPoint]:
        """The job's minutes, in order of time."""
        if task_index is None:
            return self._timeline.rows("job_id = ?", [job_id], "at, node, device")
        return self._timeline.rows("job_id = ? AND task_index = ?", [job_id, task_index], "at, node, device")
