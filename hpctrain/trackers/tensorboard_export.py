"""`hpctrain export tensorboard DIR`: a run folder per job's task (``<job id>-<name>``, ``.../task-<N>`` for an
array's tasks) with its metrics and evaluation results as scalars by step, written by tensorboard's own writer
(`tensorboard.summary.Writer`: numpy only, no TensorFlow or torch). Each export writes a folder's event file anew,
so exporting again leaves one copy of every point."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import JobRow
from hpctrain.trackers.runs import Run, evaluations_after, runs_of


def run_folder(root: Path, run: Run) -> Path:
    folder = root / f"{run.job['id']}-{run.job['name']}"
    return folder / f"task-{run.task_index}" if run.task_index >= 0 else folder


def export_tensorboard(ledger: Ledger, jobs: Sequence[JobRow], root: Path) -> tuple[int, int]:
    """Write every run of ``jobs`` under ``root``; returns (runs, scalars written)."""
    from tensorboard.summary import Writer

    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HpctrainError(f"{root}: cannot write there: {exc.strerror}") from None
    runs = scalars = 0
    for job in jobs:
        for run in runs_of(ledger, job):
            folder = run_folder(root, run)
            if folder.is_dir():
                for old in folder.glob("events.out.tfevents.*"):
                    old.unlink()
            folder.mkdir(parents=True, exist_ok=True)
            writer = Writer(str(folder))
            try:
                for _, name, step, value, at in ledger.metrics.after(job["id"], run.task_index, 0):
                    writer.add_scalar(name, value, step, wall_time=at)
                    scalars += 1
                for step, evaluator, values, at in evaluations_after(ledger, run, 0.0):
                    for name, value in values.items():
                        if isinstance(value, (int, float)):
                            writer.add_scalar(f"{evaluator}/{name}", value, step, wall_time=at)
                            scalars += 1
            finally:
                writer.close()
            runs += 1
    return runs, scalars
