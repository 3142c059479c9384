"""`hpctrain logs` on the dev cluster: a job that fails once and is requeued, followed to the end, and an array's
logs task by task (on files: tests/unit/jobs/test_logs.py)."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.cli import HPCTRAIN, run_cli
from helpers.paths import ASSETS

pytestmark = pytest.mark.slurm


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


def test_an_arrays_logs_come_task_by_task(dev_cluster, isolated_ledger):
    submitted = run_cli("submit", str(ASSETS / "specs" / "array.toml"), "--array", "3", "--json", "--wait")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = json.loads(submitted.stdout.splitlines()[0])["ledger_ids"][0]
    lines = run_cli("logs", str(job)).stdout.splitlines()
    headers = [line for line in lines if line.startswith("==> task ")]
    assert [h.split(":")[0] for h in headers] == ["==> task 0", "==> task 1", "==> task 2"]
    for task in range(3):
        own = run_cli("logs", str(job), "--task", str(task)).stdout.splitlines()
        assert own[0] == headers[task] and own[1].startswith("==> attempt 0 began ")
        assert [line.split(" param ")[0] for line in own[2:]] == [f"task {task}"]
