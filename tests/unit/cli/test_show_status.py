"""`hpctrain show` and `hpctrain status` on ledger rows alone, no Slurm (the cluster tests feed real ones)."""

from __future__ import annotations

import pytest

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

from helpers.cli import run_cli


def _job(ledger: Ledger, is_array: bool, runs: list[tuple[str, str, int | None]]) -> int:
    """A completed job whose runs (task 0 of an array, else no task) ended with (state, cause, requeued)."""
    job = Table(ledger, "jobs").insert({"name": "j", "site": "dev", "state": "COMPLETED", "slurm_job_id": "41",
                                        "is_array": int(is_array)})
    for attempt, (state, cause, requeued) in enumerate(runs, 1):
        ledger.attempts.record(job, 0 if is_array else -1, attempt, state=state, cause=cause, requeued=requeued,
                               alloc_gpus=2, decision=cause if requeued == 0 else None)
    return job


def _rows(table: str) -> list[list[str]]:
    """The cells of a rich table's header and rows."""
    return [[c.strip() for c in line.strip("│┃").split("│" if "│" in line else "┃")]
            for line in table.splitlines() if line.startswith(("│", "┃"))]


@pytest.mark.parametrize("is_array", [False, True])
def test_show_gives_a_completed_run_as_completed_and_a_task_only_for_an_array(isolated_ledger, is_array):
    with Ledger(isolated_ledger) as ledger:
        job = _job(ledger, is_array, [("PREEMPTED", "preemption", 1), ("COMPLETED", "completed", 0)])
    out = run_cli("show", str(job))
    assert out.returncode == 0, out.stderr
    header, *runs = _rows(out.stdout)
    assert ("task" in header) == is_array
    then = header.index("then")
    assert [r[then] for r in runs] == ["requeued", "completed"]
    assert [r[0] for r in runs] == (["0", "0"] if is_array else ["1", "2"])  # the task, or the attempt
    assert "stopped" not in out.stdout


def test_status_without_active_jobs_says_so_in_one_line_and_names_all(isolated_ledger):
    out = run_cli("status", "--no-refresh")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "no active jobs on site dev; `hpctrain status --all` lists finished ones too\n"
    assert run_cli("status", "--no-refresh", "--all").stdout == "no jobs of site dev in the ledger\n"
    with Ledger(isolated_ledger) as ledger:
        _job(ledger, False, [("COMPLETED", "completed", 0)])
    assert run_cli("status", "--no-refresh").stdout.startswith("no active jobs on site dev;")
    assert "hpctrain status: site dev" in run_cli("status", "--no-refresh", "--all").stdout
    assert run_cli("status", "--no-refresh", "--json").stdout == "[]\n"


def test_show_of_a_big_array_counts_its_tasks_and_lists_the_runs_asked_for(isolated_ledger):
    with Ledger(isolated_ledger) as ledger:
        job = ledger.jobs.record({"name": "big", "site": "dev", "is_array": 1},
                                 [{"task_index": t, "param_index": t} for t in range(1000)])
        for t in range(1000):
            state = "FAILED" if t in (7, 700) else "RUNNING" if t < 300 else "PENDING"
            ledger.jobs.set_task_state(job, t, state)
            if state != "PENDING":
                ledger.attempts.record(job, t, 0, state=state, cause="error" if state == "FAILED" else None,
                                       requeued=0 if state == "FAILED" else None, decision="stopped: exit 1")
    out = run_cli("show", str(job))
    assert out.returncode == 0, out.stderr
    assert "tasks: 699 PENDING, 299 RUNNING, 2 FAILED; --task N or --state STATE lists their runs" in out.stdout
    assert _rows(out.stdout) == [] and "stopped after" not in out.stdout
    failed = run_cli("show", str(job), "--state", "failed")
    header, *runs = _rows(failed.stdout)
    assert [(r[header.index("task")], r[header.index("state")]) for r in runs] == [("7", "FAILED"), ("700", "FAILED")]
    assert failed.stdout.count("stopped after attempt 0") == 2
    one = _rows(run_cli("show", str(job), "--task", "299").stdout)
    assert [r[0] for r in one[1:]] == ["299"]
    missing = run_cli("show", str(job), "--task", "1000")
    assert (missing.returncode, missing.stderr) == (2, f"hpctrain: error: job {job} has no task 1000 (tasks 0 to 999)\n")
