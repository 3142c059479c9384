"""`hpctrain logs`: a job's output across its runs, marked where each began, one run's or one rank's lines, followed
while the job runs; on files (on the dev cluster, with a job that fails once and is requeued:
tests/cluster/test_logs_cluster.py)."""

from __future__ import annotations

from pathlib import Path

from hpctrain.jobs.logs import LogView, RunStart

FIRST = "setup\n0: run 0 rank 0\n1: run 0 rank 1\n"
SECOND = "0: run 1 rank 0\n1: run 1 rank 1\n"


def starts(log: Path, *offsets: int) -> list[RunStart]:
    return [RunStart(n, log.name, offset, 10 * n or None, 1_800_000_000 + n) for n, offset in enumerate(offsets)]


def test_marks_each_run_where_it_began_and_filters_by_run_and_rank(tmp_path):
    log = tmp_path / "slurm-7.out"
    log.write_text(FIRST + SECOND)
    runs = starts(log, len("setup\n"), len(FIRST))
    lines = LogView(log).read(runs)
    assert lines == ["setup", runs[0].mark(), "0: run 0 rank 0", "1: run 0 rank 1", runs[1].mark(),
                     "0: run 1 rank 0", "1: run 1 rank 1"]
    assert runs[1].mark().startswith("==> attempt 1 began ") and runs[1].mark().endswith(", from checkpoint step 10 <==")
    assert runs[0].mark().endswith(", from the start <==")
    assert LogView(log, attempt=1).read(runs) == [runs[1].mark(), "0: run 1 rank 0", "1: run 1 rank 1"]
    assert LogView(log, rank=1).read(runs) == [runs[0].mark(), "1: run 0 rank 1", runs[1].mark(), "1: run 1 rank 1"]
    assert LogView(log, attempt=0, rank=0).read(runs) == [runs[0].mark(), "0: run 0 rank 0"]
    assert LogView(tmp_path / "slurm-8.out").read([]) == []  # not written yet


def test_following_gives_whole_lines_once_and_marks_a_run_journaled_late(tmp_path):
    log = tmp_path / "slurm-7.out"
    view = LogView(log)
    log.write_text("setup\n0: run 0 ra")
    assert view.read([], final=False) == ["setup"]
    with log.open("a") as fh:
        fh.write("nk 0\n")
    # The run's start is journaled only now, at an offset already read: marked where the reading is.
    runs = starts(log, len("setup\n"))
    assert view.read(runs, final=False) == [runs[0].mark(), "0: run 0 rank 0"]
    with log.open("a") as fh:
        fh.write("tail without newline")
    assert view.read(runs, final=False) == []
    assert view.read(runs, final=True) == ["tail without newline"]
    assert view.read(runs, final=True) == []
