"""`hpctrain show` and `hpctrain status` on ledger rows alone, no Slurm (the cluster tests feed real ones)."""

from __future__ import annotations

import time

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


def test_status_of_many_active_jobs_is_a_screenful_by_group_and_long_lists_each(isolated_ledger):
    """Issue 59: 1,970 active jobs printed 3,384 lines. Past 20 submissions, status counts them by group (a sweep's,
    or one name's) and state, and lists the ones that need the eye (here 30 stalled: 20 shown, the rest counted)."""
    now = time.time()
    with Ledger(isolated_ledger) as ledger:
        jobs = Table(ledger, "jobs")
        ledger.sweeps.create("s1", "random", "{}")
        running = []
        for i in range(600):
            name, sweep = [("trial", "s1"), ("run0", None), ("run1", None)][i % 3]
            state = "PENDING" if i // 3 % 4 == 0 else "RUNNING"
            job = jobs.insert({"name": name, "sweep_id": sweep, "site": "dev", "state": state,
                               "slurm_job_id": str(100 + i), "submitted_at": now - 3600})
            running += [job] * (state == "RUNNING")
        for job_id in running[:30]:  # running jobs whose last step was an hour ago
            ledger.metrics.record(job_id, -1, 1, {"loss": 1.0}, 0, now - 3600)
    out = run_cli("status", "--no-refresh")
    assert out.returncode == 0, out.stderr
    lines = [line.rstrip() for line in out.stdout.splitlines()]
    assert len(lines) <= 40, out.stdout
    assert lines[0] == "hpctrain status: site dev: 600 active submissions, by group"
    groups = {r[0]: r[1:] for r in _rows(out.stdout)[1:]}
    assert groups == {"run0": ["200", "150 RUNNING, 50 PENDING", "-", "0", "0"],
                      "run1": ["200", "150 RUNNING, 50 PENDING", "-", "0", "0"],
                      "sweep s1": ["200", "150 RUNNING, 50 PENDING", "-", "0", "0"]}
    stalled = [line for line in lines if "stalled: no training step for 60 min" in line]
    assert len(stalled) == 20 and stalled[0].startswith(f"  job {running[29]}: ")  # newest first
    assert lines[-1] == "  and 10 more: `hpctrain status --long` lists every submission with all of them"
    long = run_cli("status", "--no-refresh", "--long").stdout
    assert len(_rows(long)) == 601 and long.count("stalled: no training step") == 30


def test_show_of_a_split_array_gives_its_submission_and_its_newest_events(isolated_ledger):
    """Issue 59: `show` of one job of a 5,000-task array split past MaxArraySize printed every event of that job
    (2,710 lines) and nothing of the other jobs. It lists each job of the submission with its tasks counted, and
    the newest 30 events, the ones before counted by kind."""
    with Ledger(isolated_ledger) as ledger:
        ids: list[int] = []
        for part, (count, state) in enumerate([(1000, "COMPLETED"), (1000, "RUNNING"), (500, "PENDING")]):
            group = {"group_id": ids[0]} if ids else {}
            ids.append(ledger.jobs.record({"name": "big", "site": "dev", "is_array": 1, **group},
                                          [{"task_index": t, "param_index": 1000 * part + t} for t in range(count)]))
            ledger.jobs.set_state(ids[-1], state)
            for t in range(count):
                ledger.jobs.set_task_state(ids[-1], t, "FAILED" if (part, t) == (0, 7) else state)
        for n in range(100):
            ledger.events.add("attempt_end" if n % 4 else "requeue", f"event {n}", ids[1], {}, at=1000.0 + n)
    out = run_cli("show", str(ids[1]))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) < 80, out.stdout
    assert "submission: 3 jobs of 2,500 tasks (split past MaxArraySize)" in out.stdout
    parts = [r for r in _rows(out.stdout) if r[0].split()[0].isdigit()]
    assert [(r[0], r[2], r[3], r[4]) for r in parts] == [
        (str(ids[0]), "COMPLETED", "1,000", "999 COMPLETED, 1 FAILED"),
        (f"{ids[1]} (this)", "RUNNING", "1,000", "1,000 RUNNING"),
        (str(ids[2]), "PENDING", "500", "500 PENDING")]
    assert "  70 earlier events (52 attempt_end, 18 requeue); --json lists them all" in lines
    assert sum(" event " in line for line in lines) == 30 and lines[-1].endswith("attempt_end: event 99")


def test_a_job_of_a_site_whose_config_is_not_found_is_shown_once_ended_and_never_asked_of_this_cluster(
        isolated_ledger):
    """A job of another cluster (its site config given by path at submit): once ended, `show` needs no Slurm; while
    it may still run, `show` and `cancel` would ask this cluster about another's Slurm id, and say so instead."""
    with Ledger(isolated_ledger) as ledger:
        ended = Table(ledger, "jobs").insert({"name": "j", "site": "far", "state": "COMPLETED", "slurm_job_id": "41"})
        pending = Table(ledger, "jobs").insert({"name": "j", "site": "far", "state": "PENDING", "slurm_job_id": "42",
                                                "group_id": 2})
    assert run_cli("show", str(ended)).returncode == 0
    for argv in (["show", str(pending)], ["cancel", str(pending)]):
        out = run_cli(*argv)
        assert out.returncode != 0 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
        assert out.stderr.startswith(f"hpctrain: error: job {pending} runs on site 'far', not 'dev': give --site its"
                                     " config"), out.stderr
    with Ledger(isolated_ledger) as ledger:
        assert [e["kind"] for e in ledger.events.of_job(pending)] == []  # nothing asked of Slurm
