"""The comparison page (`hpctrain compare --html`): every run's curves overlaid, by step and by GPU-hour, and the
tables of what differs and what each run reached. Held-out metrics (``eval/...``) are drawn as markers, training
ones smoothed over their faint raw values."""

from __future__ import annotations

from typing import Any

from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import AttemptRow
from hpctrain.report import collect
from hpctrain.report.compare import Comparison, Run, evaluation_points
from hpctrain.report.page import Plot, Table, render
from hpctrain.report.plots import Series, lines

MAX_RUNS_DRAWN = 20  # curves in one plot; more would be unreadable


def compare_page(ledger: Ledger, comparison: Comparison) -> str:
    runs = comparison.runs
    drawn = runs[:MAX_RUNS_DRAWN]
    note = f"the first {MAX_RUNS_DRAWN} of {len(runs)} runs drawn" if len(runs) > MAX_RUNS_DRAWN else ""
    plots = []
    for name in comparison.metrics:
        by_step, by_hours, evaluation = _curves(ledger, drawn, name)
        held_out = evaluation or name.startswith("eval/")
        for series, xlabel in ((by_step, "step"), (by_hours, "GPU-hours")):
            plots.append(_overlaid(f"{name} vs {xlabel}", name, series, xlabel, held_out=held_out, note=note))
    facts: list[tuple[str, Any]] = [
        ("runs", ", ".join(f"{r.label} ({r.name})" for r in runs)),
        ("differ in", ", ".join(comparison.differing) or "nothing recorded"),
        ("same in every run", ", ".join(f"{k}={v}" for k, v in comparison.same.items()) or "-"),
    ]
    return render(
        f"comparison of {len(runs)} runs", facts, plots, [_settings_table(comparison), _results_table(comparison)]
    )


def _overlaid(title: str, ylabel: str, series: Series, xlabel: str, held_out: bool, note: str) -> Plot:
    if not series:
        return Plot(title, None)
    if held_out:
        return Plot(title, lines({}, title, xlabel, ylabel, sparse=series), note)
    return Plot(title, lines(series, title, xlabel, ylabel, smooth=collect.smoothed), note)


def _curves(ledger: Ledger, runs: list[Run], name: str) -> tuple[Series, Series, bool]:
    """Each run's values of ``name`` by step, and by the GPU-hours its job had used when it reported each one; and
    whether they are evaluation results (EVALUATOR:METRIC, by step only: the time of a checkpoint's step is not
    kept)."""
    by_step: dict[str, tuple[list[int], list[float]]] = {}
    by_hours: dict[str, tuple[list[float], list[float]]] = {}
    evaluation = False
    for run in runs:
        rows = [r for r in ledger.metrics.of_job(run.job_id, run.task_index, (name,)) if r["value"] is not None]
        if not rows:
            points = evaluation_points(ledger.evaluations.of_job(run.job_id), run.task_index, (name,)).get(name)
            if points:
                by_step[run.label] = ([p[0] for p in points], [p[1] for p in points])
                evaluation = True
            continue
        attempts = [a for a in ledger.attempts.of_task(run.job_id, run.task_index) if a["started_at"] is not None]
        values = [float(r["value"] or 0.0) for r in rows]
        by_step[run.label] = ([r["step"] for r in rows], values)
        by_hours[run.label] = ([_gpu_hours_at(attempts, r["time"]) for r in rows], values)
    return by_step, by_hours, evaluation


def _gpu_hours_at(attempts: list[AttemptRow], at: float | None) -> float:
    """GPU-hours the run's attempts had used at time ``at`` (a metric's report time)."""
    if at is None:
        return 0.0
    total = 0.0
    for a in attempts:
        start, end = a["started_at"] or at, a["ended_at"] or at
        total += (a["alloc_gpus"] or 0) * max(0.0, min(end, at) - start) / 3600
    return total


def _settings_table(comparison: Comparison) -> Table:
    return Table("what differs", *comparison.settings_table())


def _results_table(comparison: Comparison) -> Table:
    return Table("results", *comparison.results_table())
