"""Goodput by cause from a job's runs and job-step starts (the ledger's attempts and segments rows)."""

import pytest

from hpctrain.jobs.goodput import CAUSES, job_goodput


def run(attempt, start, end, elapsed, cause, task=-1):
    return {"task_index": task, "attempt": attempt, "started_at": start, "ended_at": end, "elapsed_s": elapsed,
            "cause": cause}


def seg(attempt, restart, main, loaded, resumed, steps, seconds, last, last_at, hung=0, task=-1):
    return {"task_index": task, "attempt": attempt, "step_restart": restart, "main_at": main, "loaded_at": loaded,
            "resumed_from": resumed, "steps": steps, "step_seconds": seconds, "last_step": last, "last_step_at": last_at,
            "hung": hung}


# Run 0: a start that hangs after step 20 (restarted from 10), one whose rank dies after step 30 (restarted from
# 25), one preempted at step 35 (checkpointed); 30 s in the queue; run 1 trains from 35 to 55 and ends.
RUNS = [run(0, 1000, 1100, 100, "preemption"), run(1, 1130, 1160, 32, "completed")]
SEGMENTS = [seg(0, 0, 1005, 1010, 0, 20, 20.0, 20, 1035, hung=1), seg(0, 1, 1050, 1055, 10, 20, 20.0, 30, 1080),
            seg(0, 2, 1085, 1088, 25, 10, 10.0, 35, 1098), seg(1, 0, 1132, 1135, 35, 20, 20.0, 55, 1157)]


def test_each_runs_time_is_split_by_cause_and_adds_up_to_slurms():
    got = job_goodput(RUNS, SEGMENTS, now=2000)
    first, second = got[(-1, 0)], got[(-1, 1)]
    assert first.seconds == {"productive": 35, "recomputed": 15, "startup": 18, "overhead": 10, "hang": 15,
                             "crash": 5, "stop": 2, "end": 0, "rerun": 0, "interactive": 0, "other": 0}
    assert first.queue_s == 30
    assert second.seconds == {**dict.fromkeys(CAUSES, 0), "productive": 20, "startup": 5, "overhead": 2, "end": 3,
                              "other": 2}
    assert second.queue_s == 0
    assert [sum(g.seconds.values()) for g in (first, second)] == [100, 32]


def test_a_sessions_run_is_interactive_time_whole():
    """A run of `hpctrain notebook` is a person's time at the GPUs: none of it training, none of it lost."""
    (good,) = job_goodput([{**RUNS[1], "cause": "cancelled", "interactive": 1}], [], now=2000).values()
    assert good.seconds == {**dict.fromkeys(CAUSES, 0), "interactive": 32}


def test_a_run_slurm_started_after_the_work_was_done_is_all_rerun():
    """Slurm 24.11's run after a completed one (its batch script ends it at once): all of it is lost to the rerun."""
    got = job_goodput([*RUNS, run(2, 1170, 1174, 4, "rerun")], SEGMENTS, now=2000)
    assert got[(-1, 2)].seconds == {**dict.fromkeys(CAUSES, 0), "rerun": 4}
    assert got[(-1, 1)].queue_s == 10


def test_clock_differences_scale_to_slurms_elapsed_and_unjournaled_runs_are_other():
    got = job_goodput([run(0, 1000, 1100, 90, "preemption"), run(1, 1130, None, None, None)], SEGMENTS[:3], now=1200)
    assert sum(got[(-1, 0)].seconds.values()) == pytest.approx(90)
    assert got[(-1, 0)].seconds["hang"] == pytest.approx(15 * 0.9)
    assert got[(-1, 1)].seconds == {**dict.fromkeys(CAUSES, 0), "other": 70}  # still running, journaled nothing yet


def test_array_tasks_are_accounted_apart():
    runs = [run(0, 0, 10, 10, "completed", task=0), run(0, 0, 10, 10, "error", task=1)]
    segments = [seg(0, 0, 1, 2, 0, 5, 5.0, 5, 8, task=0), seg(0, 0, 1, 2, 0, 5, 5.0, 5, 8, task=1)]
    got = job_goodput(runs, segments, now=100)
    assert got[(0, 0)].seconds["end"] == got[(1, 0)].seconds["crash"] == 2
