"""How busy a job's GPUs are, as `show`, `status` and its alerts say it (issue 61): from the ledger's `gpu_use`
rows (hpctrain.runtime.utilization's records), each task's newest job step start."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from hpctrain.ledger import Ledger
from hpctrain.ledger.gpus import SUMMARY
from hpctrain.ledger.rows import GpuUseRow


@dataclass(frozen=True)
class GpuUse:
    """The GPUs of one job's newest job step starts: each one's row and their mean utilization weighted by the time
    sampled. A GPU is idle now past its policy's after_s at its last reading, and alerts past its alert_s."""

    kind: str
    gpus: list[GpuUseRow]
    mean: float | None

    @property
    def idle(self) -> list[GpuUseRow]:
        return [g for g in self.gpus if g["idle_now_s"] >= max(g["after_s"], 1.0)]

    @property
    def alerting(self) -> list[GpuUseRow]:
        return [g for g in self.gpus if g["idle_now_s"] >= max(g["alert_s"], g["after_s"], 1.0)]

    def as_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "mean": self.mean,
            "idle": list(map(_namer(self.gpus), self.idle)),
            "gpus": [{k: g.get(k) for k in ("task_index", "node", "device", *SUMMARY)} for g in self.gpus],
        }


def newest(rows: Iterable[GpuUseRow]) -> list[GpuUseRow]:
    """The rows of each task's newest job step start (the newest run's, its newest restart in place)."""
    latest: dict[int, tuple[int, int]] = {}
    kept = list(rows)
    for r in kept:
        latest[r["task_index"]] = max(latest.get(r["task_index"], (-1, -1)), (r["attempt"], r["step_restart"]))
    return [r for r in kept if (r["attempt"], r["step_restart"]) == latest[r["task_index"]]]


def gpu_use(rows: Iterable[GpuUseRow]) -> GpuUse | None:
    """The job's GPU use from its `gpu_use` rows; None before any was sampled."""
    gpus = newest(rows)
    if not gpus:
        return None
    seconds = sum(g["seconds"] for g in gpus if g["mean"] is not None)
    mean = sum(g["mean"] * g["seconds"] for g in gpus if g["mean"] is not None) / seconds if seconds else None
    return GpuUse(gpus[0]["kind"], gpus, mean)


def uses_of(ledger: Ledger, job_ids: Iterable[int]) -> dict[int, GpuUse]:
    """`gpu_use` of each of the jobs sampled (one query)."""
    rows: dict[int, list[GpuUseRow]] = {}
    for row in ledger.gpus.of_jobs(job_ids):
        rows.setdefault(row["job_id"], []).append(row)
    return {job_id: use for job_id, found in rows.items() if (use := gpu_use(found)) is not None}


def idle_words(use: GpuUse, idle: Sequence[GpuUseRow]) -> str | None:
    """The GPUs ``idle`` of ``use``'s, in words (None: none is): some of them, or all."""
    if not idle:
        return None
    minutes = min(g["idle_now_s"] for g in idle) / 60
    below = max(g["below_percent"] for g in idle)
    proxy = " (cpu: each stands for its local rank's processes)" if use.kind == "cpu" else ""
    if len(idle) == len(use.gpus):
        return (
            f"all {len(use.gpus)} GPUs under {below:g} % for {minutes:.0f} min{proxy}: is the job waiting on something?"
        )
    names = _names(idle, use.gpus)
    return (
        f"GPUs {names} of {len(use.gpus)} under {below:g} % for {minutes:.0f} min{proxy}: "
        "does the script use every GPU it asks for?"
    )


def gpus_line(use: GpuUse) -> str:
    """'GPUs (nvml) 24 % on average: 0 97 %, 1 0 %, ...; peak memory 61 of 80 GiB' for `show`."""
    name = _namer(use.gpus)
    each = ", ".join(f"{name(g)} {_percent(g['mean'])}" for g in use.gpus)
    peaks = [(g["mem_peak"], g["mem_total"]) for g in use.gpus if g["mem_peak"] is not None and g["mem_total"]]
    memory = ""
    if peaks:
        peak, total = max(peaks)
        memory = f"; peak memory {peak / 2**30:.1f} of {total / 2**30:.0f} GiB"
    source = "nvml" if use.kind == "nvml" else "cpu: their ranks' processes"
    return f"GPUs ({source}) {_percent(use.mean)} on average: {each}{memory}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} %"


def _namer(gpus: Sequence[GpuUseRow]) -> Callable[[GpuUseRow], str]:
    """How to name a GPU of ``gpus`` as the user reads it: its number, with its node where the job has several (and
    its task in an array)."""
    many_nodes = len({g["node"] for g in gpus}) > 1
    many_tasks = len({g["task_index"] for g in gpus}) > 1

    def name(gpu: GpuUseRow) -> str:
        return (
            (f"task {gpu['task_index']} " if many_tasks else "")
            + (f"{gpu['node']}:" if many_nodes else "")
            + gpu["device"]
        )

    return name


def _names(idle: Sequence[GpuUseRow], gpus: Sequence[GpuUseRow]) -> str:
    """'1-3', '0, 2', 'n1:1-3, n2:0': runs of consecutive numbers on one node joined."""
    if len({g["node"] for g in gpus}) > 1 or len({g["task_index"] for g in gpus}) > 1:
        return ", ".join(map(_namer(gpus), idle))
    numbers = sorted(int(g["device"]) for g in idle)
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
