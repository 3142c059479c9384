"""What the reports show, read from the ledger: a job's rows and curves, and GPU-hours accumulated over time."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from hpctrain.errors import HpctrainError
from hpctrain.jobs.accounting import Usage
from hpctrain.jobs.goodput import GPU_CAUSES
from hpctrain.ledger import Ledger
from hpctrain.ledger.gpus import GpuMinute
from hpctrain.ledger.rows import AttemptRow, CheckpointRow, EvaluationRow, JobRow

# A key (an array task's index, -1 for a plain job; a trial's number) -> (steps, values) in step order.
Curves = dict[int, tuple[list[int], list[float]]]
# The points of a curve a report draws at most: a plot is some 1,000 pixels wide, and 2,000 ranges of steps drawn by
# their lowest and highest values look as all of them do (500,000 points took 1 s to read and more to draw).
PLOT_POINTS = 4000


@dataclass
class JobData:
    job: JobRow
    attempts: list[AttemptRow]
    checkpoints: list[CheckpointRow]
    metrics: dict[str, Curves]
    env: dict[str, str]
    evaluations: list[EvaluationRow]


def job_data(ledger: Ledger, job_id: int) -> JobData:
    """A job's row, attempts, checkpoints, metric curves (a long one as the lows and highs a plot can show:
    `Metrics.points`) and (redacted) environment."""
    job = ledger.jobs.get(job_id)
    if job is None:
        raise HpctrainError(f"job {job_id}: no such ledger id (see `hpctrain status --all`)")
    metrics: dict[str, Curves] = defaultdict(dict)
    for name, task, step, value in ledger.metrics.points(job_id, most=PLOT_POINTS):
        add_point(metrics[name], task, step, value)
    return JobData(
        job,
        ledger.attempts.of_job(job_id),
        ledger.checkpoints.of_job(job_id),
        dict(metrics),
        redacted_env(job["spec_json"]),
        ledger.evaluations.of_job(job_id),
    )


# A GPU's curve over time, by its name as `show` gives it ("0", "n1:0", "task 3 n1:0"): (moments, values).
TimeCurves = dict[str, tuple[list[datetime], list[float]]]


def gpu_curves(minutes: Sequence[GpuMinute]) -> tuple[TimeCurves, TimeCurves]:
    """Each GPU's utilization (percent) and peak memory (MiB) over time, from the job's timeline."""
    nodes, tasks = {m.node for m in minutes}, {m.task_index for m in minutes}
    util: TimeCurves = {}
    mem: TimeCurves = {}
    for m in minutes:
        prefix = (f"task {m.task_index} " if len(tasks) > 1 else "") + (f"{m.node}:" if len(nodes) > 1 else "GPU ")
        at = datetime.fromtimestamp(m.at)
        for curves, values in ((util, m.util), (mem, m.mem)):
            for device, value in values.items():
                moments, ys = curves.setdefault(prefix + device, ([], []))
                moments.append(at)
                ys.append(value)
    return util, mem


def add_point(curves: Curves, key: int, step: int, value: float) -> None:
    steps, values = curves.setdefault(key, ([], []))
    steps.append(step)
    values.append(value)


def checkpoint_durations(checkpoints: list[CheckpointRow]) -> Curves:
    """Seconds each checkpoint took to write, by step, per task."""
    curves: Curves = {}
    for c in checkpoints:
        if c["duration_s"] is not None:
            add_point(curves, c["task_index"], c["step"], c["duration_s"])
    return curves


def smoothed(values: Sequence[float], span: int | None = None) -> list[float]:
    """The exponential moving average of ``values`` over ``span`` points (default: a 20th of them, at least
    1, which leaves them unchanged), bias-corrected as TensorBoard's so that it starts at the first value."""
    span = span or max(1, len(values) // 20)
    weight = 1 - 2 / (span + 1)  # of the average so far
    out, average, bias = [], 0.0, 1.0
    for value in values:
        average = weight * average + (1 - weight) * value
        bias *= weight
        out.append(average / (1 - bias))
    return out


def attempt_marks(attempts: list[AttemptRow]) -> list[tuple[int, int, str]]:
    """(task, step, label) where each resumed attempt began: the checkpoint step it started from, for every
    attempt after its task's first whose step is known, labelled "attempt 2 after preemption" (the cause that
    ended the attempt before). ``attempts`` in task and attempt order, as the ledger lists them."""
    marks = []
    for before, a in zip(attempts, attempts[1:]):
        if a["task_index"] == before["task_index"] and a["step_start"] is not None:
            after = f" after {before['cause'].replace('_', ' ')}" if before["cause"] else ""
            marks.append((a["task_index"], a["step_start"], f"attempt {a['attempt']}{after}"))
    return marks


def redacted_env(spec_json: str | None) -> dict[str, str]:
    """The spec's environment entries; a secret one shows as "<secret>" whatever the ledger holds."""
    env = json.loads(spec_json or "{}").get("env") or {}
    out = {}
    for name, entry in sorted(env.items()):
        entry = entry if isinstance(entry, dict) else {"value": entry}
        out[name] = "<secret>" if entry.get("secret") else str(entry.get("value"))
    return out


def gpu_hours_by_cause(runs: list[Usage], label: Callable[[Usage], str]) -> tuple[list[str], dict[str, list[float]]]:
    """Bars (runs grouped by ``label``, in order of first appearance) and, per goodput cause, each bar's GPU-hours."""
    bars: dict[str, dict[str, float]] = {}
    for u in runs:
        bar = bars.setdefault(label(u), dict.fromkeys(GPU_CAUSES, 0.0))
        for cause, hours in u.causes.items():
            bar[cause] += hours
    return list(bars), {cause: [bar[cause] for bar in bars.values()] for cause in GPU_CAUSES}
