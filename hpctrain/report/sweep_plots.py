"""PNG plots of a sweep: the metric of every trial with the best so far, and parameter importance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.report.plots import figure, png
from hpctrain.sweep.methods import TrialRecord, importance
from hpctrain.sweep.spec import SweepSpec


def _completed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["state"] == "completed" and r["value"] is not None]


def metric_png(spec: SweepSpec, rows: list[dict[str, Any]]) -> bytes:
    """The metric of every completed trial, with the best value so far."""
    done = _completed(rows)
    fig, ax = figure(7, 4)
    ax.scatter([r["number"] for r in done], [r["value"] for r in done], s=14, label="completed trial")
    pick = min if spec.direction == "minimize" else max
    best, running = [], None
    for r in done:
        running = r["value"] if running is None else pick(running, r["value"])
        best.append(running)
    ax.step([r["number"] for r in done], best, where="post", color="C3", label="best so far")
    ax.set(xlabel="trial", ylabel=spec.metric, title=f"sweep {spec.name}: {spec.metric} ({spec.method})")
    ax.legend()
    return png(fig)


def importance_png(spec: SweepSpec, rows: list[dict[str, Any]]) -> tuple[bytes | None, str]:
    """Each parameter's importance for the metric (Optuna's evaluator), or None and why it cannot tell yet."""
    done = _completed(rows)
    scores = importance(spec, [TrialRecord(r["number"], r["params"], "completed", r["value"]) for r in done])
    if not scores:
        return None, (
            f"parameter importance needs 2 completed trials with different values of {spec.metric} "
            f"({len(done)} reported it, {len({r['value'] for r in done})} different value(s))"
        )
    fig, ax = figure(7, 1.6 + 0.4 * len(scores))  # room for the title and axis with one parameter
    names = sorted(scores, key=lambda n: scores[n])
    ax.barh(names, [scores[n] for n in names])
    ax.set(xlabel="importance (fANOVA)", title=f"sweep {spec.name}: parameter importance for {spec.metric}")
    return png(fig), ""


def write_report(spec: SweepSpec, rows: list[dict[str, Any]], out_dir: Path) -> list[tuple[Path, str]]:
    """Write ``metric.png`` and ``importance.png`` into ``out_dir`` where there is something to plot; each file
    with why it was not written ("" where it was)."""
    metric = (metric_png(spec, rows), "") if _completed(rows) else (None, f"no completed trial reported {spec.metric}")
    plots = {"metric.png": metric, "importance.png": importance_png(spec, rows)}
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (data, _) in plots.items():
        if data is not None:
            (out_dir / name).write_bytes(data)
    return [(out_dir / name, why) for name, (_, why) in plots.items()]
