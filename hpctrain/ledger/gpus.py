"""The `gpu_use` and `gpu_timeline` tables: how busy each GPU of a job was, as the nodes' samplers journal it
(hpctrain.runtime.utilization): per job step start, node and GPU the newest summary, and a row a node and
minute. Once the job has settled, `gpu_runs` and `gpu_curves` hold the same packed: a row a job step start and
node, and a row a task and node of at most a plot's worth of points, kept for a window of days."""

from __future__ import annotations

import itertools
import json
import math
import struct
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

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
# Its key's index, named by SQLite: the planner's statistics, skewed by arrays of thousands of tasks (a thousand rows
# a job on average), made a query of 900 jobs scan the whole table (2.7 s of a heavy user's `cost --causes`).
_USE_KEY = "sqlite_autoindex_gpu_use_1"
_RUN_KEY = ("job_id", "task_index", "attempt", "step_restart", "node")
_POLICY = ("below_percent", "after_s", "alert_s")
# A settled GPU's figures: mean and p10 in hundredths of a percent (NONE_16: none), then float32s (NaN: none).
_GPU = struct.Struct("<HHffffff")
_GPU_FLOATS = ("seconds", "mem_peak", "mem_total", "energy_j", "idle_s", "idle_now_s")
# A settled timeline's point: seconds after the curve's first, then per GPU its percent (NONE_8: none) and its
# memory in MEM_UNIT (NONE_16: none), rounded up: a peak.
_POINT = struct.Struct("<I")
_POINT_GPU = struct.Struct("<BH")
NONE_8, NONE_16 = 0xFF, 0xFFFF
MEM_UNIT = 8  # MiB: 512 GiB at most


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

    def settle(self, job_ids: Iterable[int], points: int, curves_since: float) -> None:
        """Pack the GPU use of these (settled) jobs: each job step start and node's summaries into one `gpu_runs`
        row, each task and node's timeline into one `gpu_curves` row of at most ``points`` points (runs of
        consecutive minutes merged: each GPU's mean percent, its memory's peak); curves that begin before
        ``curves_since`` go."""
        ids = sorted(set(job_ids))
        with self.ledger.transaction() as db:
            for start in range(0, len(ids), IN_CHUNK):
                chunk = ids[start : start + IN_CHUNK]
                marks = ",".join("?" * len(chunk))
                use = db.query(f"SELECT * FROM gpu_use WHERE job_id IN ({marks}) ORDER BY {', '.join(_RUN_KEY)}", chunk)
                runs = [packed_run(list(g)) for _, g in itertools.groupby(use, lambda r: tuple(r[k] for k in _RUN_KEY))]
                db.conn.executemany(
                    "INSERT OR REPLACE INTO gpu_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", runs
                )
                timeline = db.execute(
                    f"SELECT job_id, task_index, node, at, util, mem FROM gpu_timeline WHERE job_id IN ({marks}) "
                    "ORDER BY job_id, task_index, node, at",
                    chunk,
                ).fetchall()
                curves = [
                    packed_curve(key, [r[3:] for r in rows], points)
                    for key, rows in itertools.groupby(timeline, lambda r: r[:3])
                ]
                db.conn.executemany("INSERT OR REPLACE INTO gpu_curves VALUES (?, ?, ?, ?, ?, ?)", curves)
                db.execute(f"DELETE FROM gpu_use WHERE job_id IN ({marks})", chunk)
                db.execute(f"DELETE FROM gpu_timeline WHERE job_id IN ({marks})", chunk)
            db.execute("DELETE FROM gpu_curves WHERE at < ?", [curves_since])

    def sampled(self, job_ids: Iterable[int]) -> set[int]:
        """Those of these jobs that have GPU use not yet packed."""
        ids = sorted(set(job_ids))
        found: set[int] = set()
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            found.update(
                r[0]
                for r in self.ledger.db.execute(
                    f"SELECT DISTINCT job_id FROM gpu_use INDEXED BY {_USE_KEY} "
                    f"WHERE job_id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
            )
        return found

    def of_job(self, job_id: int) -> list[GpuUseRow]:
        """Every GPU summary of the job, oldest run first."""
        return self.of_jobs([job_id])

    def of_jobs(self, job_ids: Iterable[int]) -> list[GpuUseRow]:
        """Every GPU summary of these jobs, by job, oldest run first (a settled job's unpacked)."""
        ids = sorted(set(job_ids))
        found: list[GpuUseRow] = []
        packed = False
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            marks = ",".join("?" * len(chunk))
            found += self._use.rows(f"job_id IN ({marks})", chunk, ", ".join((*_RUN_KEY, "device")), index=_USE_KEY)
            for run in self.ledger.db.query(f"SELECT * FROM gpu_runs WHERE job_id IN ({marks})", chunk):
                found += _unpacked_run(run)
                packed = True
        if not packed:  # in order already (a running job's, as `status` reads 24,000 array tasks')
            return found
        return sorted(found, key=lambda r: tuple(r[k] for k in (*_RUN_KEY, "device")))  # type: ignore[literal-required]

    def means(self, job_ids: Iterable[int]) -> dict[tuple[int, int], float]:
        """Each (job, task)'s mean GPU utilization over every GPU and run sampled, weighted by the time sampled."""
        sums: dict[tuple[int, int], list[float]] = {}
        for g in self.of_jobs(job_ids):
            if g["mean"] is not None and g["seconds"] > 0:
                busy_seconds = sums.setdefault((g["job_id"], g["task_index"]), [0.0, 0.0])
                busy_seconds[0] += g["mean"] * g["seconds"]
                busy_seconds[1] += g["seconds"]
        return {key: busy / seconds for key, (busy, seconds) in sums.items()}

    def idle_seconds(self, job_ids: Iterable[int], since: float = 0.0) -> dict[int, float]:
        """Each job's GPU-seconds held idle, summed over its GPUs and runs last sampled at ``since`` or later."""
        ids = sorted(set(job_ids))
        out: dict[int, float] = {}
        for start in range(0, len(ids), IN_CHUNK):
            chunk = ids[start : start + IN_CHUNK]
            out.update(
                self.ledger.db.execute(
                    f"SELECT job_id, total(idle_s) FROM (SELECT job_id, idle_s, at FROM gpu_use INDEXED BY {_USE_KEY} "
                    "UNION ALL "
                    f"SELECT job_id, idle_s, at FROM gpu_runs) WHERE job_id IN ({','.join('?' * len(chunk))}) "
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
        """The job's minutes, in order of time: per task and node, each GPU's percent and peak MiB (a settled job's
        points, none once its curves have gone past their window)."""
        minutes = [
            GpuMinute(r["at"], r["task_index"], r["node"], json.loads(r["util"]), json.loads(r["mem"]))
            for r in self._timeline.rows("job_id = ?", [job_id])
        ]
        for curve in self.ledger.db.query("SELECT * FROM gpu_curves WHERE job_id = ?", [job_id]):
            minutes += _unpacked_curve(curve)
        return sorted(minutes, key=lambda m: (m.at, m.task_index, m.node))


def packed_run(gpus: list[dict[str, Any]]) -> tuple[Any, ...]:
    """One job step start and node's `gpu_use` rows as a `gpu_runs` row."""
    first = gpus[0]
    figures = b"".join(
        _GPU.pack(_hundredths(g["mean"]), _hundredths(g["p10"]), *(_float(g[c]) for c in _GPU_FLOATS)) for g in gpus
    )
    return (
        *(first[k] for k in _RUN_KEY),
        first["kind"],
        max(g["samples"] for g in gpus),
        max(g["at"] for g in gpus),
        *(first[k] for k in _POLICY),
        sum(g["idle_s"] for g in gpus),
        ",".join(g["device"] for g in gpus),
        figures,
    )


def _unpacked_run(run: Mapping[str, Any]) -> Iterator[GpuUseRow]:
    """A `gpu_runs` row as the `gpu_use` rows it was packed from."""
    common = {k: run[k] for k in (*_RUN_KEY, "kind", "samples", "at", *_POLICY)}
    for device, figures in zip(run["devices"].split(","), _GPU.iter_unpack(run["gpus"]), strict=True):
        mean, p10, *floats = figures
        values = {c: None if math.isnan(v) else v for c, v in zip(_GPU_FLOATS, floats, strict=True)}
        row = {**common, **values, "device": device, "final": 1}
        row.update(
            mean=None if mean == NONE_16 else mean / 100,
            p10=None if p10 == NONE_16 else p10 / 100,
            seconds=values["seconds"] or 0.0,
            idle_s=values["idle_s"] or 0.0,
            idle_now_s=values["idle_now_s"] or 0.0,
        )
        yield cast("GpuUseRow", row)


def packed_curve(key: tuple[int, int, str], rows: list[tuple[float, str, str]], points: int) -> tuple[Any, ...]:
    """A task and node's timeline rows (at, util JSON, mem JSON), in order of time, as a `gpu_curves` row: runs of
    consecutive rows merged into at most ``points``."""
    width = -(-len(rows) // points)
    merged = [_merged(rows[i : i + width]) for i in range(0, len(rows), width)]
    devices = sorted({d for _, util, mem in merged for d in (*util, *mem)}, key=_device_order)
    first = merged[0][0]
    packed = bytearray()
    for at, util, mem in merged:
        packed += _POINT.pack(round(at - first))
        for d in devices:
            percent, mib = util.get(d), mem.get(d)
            packed += _POINT_GPU.pack(
                NONE_8 if percent is None else min(NONE_8 - 1, round(percent)),
                NONE_16 if mib is None else min(NONE_16 - 1, math.ceil(mib / MEM_UNIT)),
            )
    return (*key, first, ",".join(devices), bytes(packed))


def _unpacked_curve(curve: Mapping[str, Any]) -> Iterator[GpuMinute]:
    """A `gpu_curves` row as its points."""
    devices = curve["devices"].split(",")
    size = _POINT.size + _POINT_GPU.size * len(devices)
    blob = curve["points"]
    for offset in range(0, len(blob), size):
        (after,) = _POINT.unpack_from(blob, offset)
        util: dict[str, float] = {}
        mem: dict[str, float] = {}
        for i, device in enumerate(devices):
            percent, units = _POINT_GPU.unpack_from(blob, offset + _POINT.size + i * _POINT_GPU.size)
            if percent != NONE_8:
                util[device] = percent
            if units != NONE_16:
                mem[device] = units * MEM_UNIT
        yield GpuMinute(curve["at"] + after, curve["task_index"], curve["node"], util, mem)


def _merged(rows: list[tuple[float, str, str]]) -> tuple[float, dict[str, float], dict[str, float]]:
    """Consecutive timeline rows (at, util JSON, mem JSON) as one: at the first's minute, each GPU's mean percent
    and peak MiB."""
    utils: dict[str, list[float]] = {}
    peaks: dict[str, float] = {}
    for _, util, mem in rows:
        for device, percent in json.loads(util).items():
            utils.setdefault(device, []).append(percent)
        for device, mib in json.loads(mem).items():
            peaks[device] = max(peaks.get(device, mib), mib)
    return rows[0][0], {device: sum(values) / len(values) for device, values in utils.items()}, peaks


def _device_order(device: str) -> tuple[int, str]:
    """GPUs by number, then by name (a UUID)."""
    return (int(device), "") if device.isdigit() else (1 << 30, device)


def _hundredths(percent: float | None) -> int:
    return NONE_16 if percent is None else max(0, min(NONE_16 - 1, round(percent * 100)))


def _float(value: float | None) -> float:
    return math.nan if value is None else value


@dataclass(frozen=True)
class GpuMinute:
    """From ``at`` (a minute; more once the job's timeline was thinned) one node's GPUs: each one's mean
    utilization (percent) and peak memory (MiB), by GPU."""

    at: float
    task_index: int
    node: str
    util: dict[str, float]
    mem: dict[str, float]
