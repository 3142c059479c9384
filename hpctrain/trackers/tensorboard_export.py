"""`hpctrain export tensorboard DIR`: a run folder per job's task that has values (``<job id>-<name>``,
``.../task-<N>`` for an array's tasks) with its metrics and evaluation results as scalar summaries by step (what
TensorBoard's Scalars dashboard reads), framed by tensorboard's own record writer (no TensorFlow or torch).

Each export writes a folder's event file anew, under a name TensorBoard does not read, then puts it in place of the
old ones: exporting again, or after a kill, leaves one copy of every point. No symbolic link below DIR is followed,
and exports into one DIR from one ledger take turns (`lock.export_lock`)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

from hpctrain.errors import HpctrainError
from hpctrain.files import folder_fd
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import JobRow
from hpctrain.trackers.lock import export_lock
from hpctrain.trackers.runs import Point, Run, points_after, runs_of

EVENTS = "tfevents"  # TensorBoard reads the files whose names hold it
PARTIAL = ".hpctrain-partial-events"  # a file being written (a name TensorBoard skips)


def run_folder(run: Run) -> list[str]:
    """The run's folder below DIR, as its parts."""
    folder = f"{run.job['id']}-{run.job['name']}"
    return [folder, f"task-{run.task_index}"] if run.task_index >= 0 else [folder]


def export_tensorboard(ledger: Ledger, jobs: Sequence[JobRow], root: Path) -> tuple[int, int]:
    """Write every run of ``jobs`` that has values under ``root``; returns (runs, scalars written)."""
    runs = scalars = 0
    try:
        root.mkdir(parents=True, exist_ok=True)
        with export_lock(ledger, f"tensorboard:{root.resolve()}"):
            for job in jobs:
                for run in runs_of(ledger, job):
                    points = points_after(ledger, run)
                    if points:
                        with folder_fd(root, run_folder(run)) as fd:
                            _replace_events(fd, points)
                        runs, scalars = runs + 1, scalars + len(points)
    except OSError as exc:
        raise HpctrainError(f"{exc.filename or root}: cannot write there: {exc.strerror}") from None
    return runs, scalars


def _replace_events(fd: int, points: list[Point]) -> None:
    """The folder open as ``fd`` holds one event file, of ``points``: written under PARTIAL, then renamed over."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    for name in os.listdir(fd):
        if name.startswith(PARTIAL):  # left by an export that was killed
            os.unlink(name, dir_fd=fd)
    partial = f"{PARTIAL}.{os.getpid()}"
    with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=fd), "wb") as fh:
        writer = RecordWriter(fh)
        writer.write(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        for p in sorted(points, key=lambda p: (p.step, p.name)):
            value = Summary.Value(tag=p.name, simple_value=p.value)
            writer.write(Event(wall_time=p.at, step=p.step, summary=Summary(value=[value])).SerializeToString())
        fh.flush()
        os.fsync(fh.fileno())
    for name in os.listdir(fd):
        if EVENTS in name:
            os.unlink(name, dir_fd=fd)
    os.rename(partial, f"events.out.{EVENTS}.{int(time.time()):010d}.hpctrain", src_dir_fd=fd, dst_dir_fd=fd)
