"""`hpctrain logs`: a job's output across its runs, marked where each began, one run's or one rank's lines, followed
while the job runs; on files, then on the dev cluster with a job that fails once and is requeued."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpctrain.jobs.logs import LogView, RunStart

from conftest import HPCTRAIN, REPO, run_cli

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


FAILS_ONCE = """
name = "logs-twice"
command = ["python", "-c", "import os, sys, time; run = os.environ.get('SLURM_RESTART_COUNT', '0'); print('run', run, 'rank', os.environ['RANK'], flush=True); time.sleep(3); sys.exit(run == '0')"]
[resources]
nodes = 1
gpus_per_node = 2
mem = "1G"
time = "00:05:00"
account = "teamb"
qos = "normal"
[retry]
on_error = true
"""


@pytest.mark.slurm
def test_a_requeued_job_logs_both_runs_followed_to_the_end(dev_cluster, isolated_ledger, tmp_path):
    """Run 0 fails and hpctrain requeues it; `logs -f`, started before the job runs, prints both runs, each after
    its mark, and ends with the job; `--attempt` and `--rank` pick one run's or one rank's lines."""
    spec = tmp_path / "twice.toml"
    spec.write_text(FAILS_ONCE)
    submitted = run_cli("submit", str(spec), "--json")
    assert submitted.returncode == 0, submitted.stderr
    (job,) = json.loads(submitted.stdout)["ledger_ids"]
    follow = subprocess.run([*HPCTRAIN, "logs", str(job), "-f"], capture_output=True, text=True, timeout=240)
    assert follow.returncode == 0, follow.stderr
    shown = json.loads(run_cli("show", str(job), "--json").stdout)
    assert shown["job"]["state"] == "COMPLETED" and len(shown["attempts"]) == 2, shown["attempts"]

    full = run_cli("logs", str(job)).stdout.splitlines()
    assert follow.stdout.splitlines() == full
    marks = [i for i, line in enumerate(full) if line.startswith("==> attempt ")]
    assert [full[i].split()[2] for i in marks] == ["0", "1"]
    assert {"0: run 0 rank 0", "1: run 0 rank 1"} <= set(full[marks[0] + 1:marks[1]])
    assert {"0: run 1 rank 0", "1: run 1 rank 1"} <= set(full[marks[1] + 1:])
    second = run_cli("logs", str(job), "--attempt", "1").stdout.splitlines()
    assert second[0] == full[marks[1]] and {"0: run 1 rank 0", "1: run 1 rank 1"} <= set(second)
    assert not any("run 0" in line for line in second)
    rank1 = run_cli("logs", str(job), "--rank", "1").stdout.splitlines()
    assert [line for line in rank1 if not line.startswith("==> ")] == ["1: run 0 rank 1", "1: run 1 rank 1"]

    wrong = run_cli("logs", str(job), "--task", "2")
    assert wrong.returncode == 2 and wrong.stderr == f"hpctrain: error: job {job} is not an array: it has no task 2\n"


@pytest.mark.slurm
def test_an_arrays_logs_come_task_by_task(dev_cluster, isolated_ledger):
    submitted = run_cli("submit", str(REPO / "tests" / "specs" / "array.toml"), "--array", "3", "--json", "--wait")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = json.loads(submitted.stdout.splitlines()[0])["ledger_ids"][0]
    lines = run_cli("logs", str(job)).stdout.splitlines()
    headers = [line for line in lines if line.startswith("==> task ")]
    assert [h.split(":")[0] for h in headers] == ["==> task 0", "==> task 1", "==> task 2"]
    for task in range(3):
        own = run_cli("logs", str(job), "--task", str(task)).stdout.splitlines()
        assert own[0] == headers[task] and own[1].startswith("==> attempt 0 began ")
        assert [line.split(" param ")[0] for line in own[2:]] == [f"task {task}"]
