"""PNG plots of a sweep: the metric of every trial with the best so far, and parameter importance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.sweep.methods import TrialRecord, importance
from hpctrain.sweep.spec import SweepSpec


def write_report(spec: SweepSpec, rows: list[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Write ``metric.png`` and (with enough completed trials) ``importance.png`` into ``out_dir``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    done = [r for r in rows if r["state"] == "completed" and r["value"] is not None]
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.scatter([r["number"] for r in done], [r["value"] for r in done], s=14, label="completed trial")
    pick = min if spec.direction == "minimize" else max
    best, running = [], None
    for r in done:
        running = r["value"] if running is None else pick(running, r["value"])
        best.append(running)
    ax.step([r["number"] for r in done], best, where="post", color="C3", label="best so far")
    ax.set(xlabel="trial", ylabel=spec.metric, title=f"sweep {spec.name}: {spec.metric} ({spec.method})")
    ax.legend()
    written.append(_save(fig, out_dir / "metric.png"))

    scores = importance(spec, [TrialRecord(r["number"], r["params"], "completed", r["value"]) for r in done])
    if scores:
        fig, ax = plt.subplots(figsize=(7, 0.6 + 0.4 * len(scores)))
        names = sorted(scores, key=scores.get)
        ax.barh(names, [scores[n] for n in names])
        ax.set(xlabel="importance (fANOVA)", title=f"sweep {spec.name}: parameter importance for {spec.metric}")
        written.append(_save(fig, out_dir / "importance.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
