"""Sweeps on the dev cluster: concurrent cron ticks never duplicate a trial, a tick with slurmctld down
changes nothing, early stopping cancels the trials behind the median."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.slurm.states import TERMINAL

from helpers.cli import HPCTRAIN, run_cli
from helpers.cluster import DEV_CLUSTER
from helpers.lanes import lanes
from helpers.sweep import sweep_spec
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
def snapshot(ledger_path: Path) -> dict[str, list]:
    with Ledger(ledger_path) as ledger:
        return {t: [tuple(r.values()) for r in Table(ledger, t).rows()]
                for t in ("sweeps", "trials", "jobs", "array_tasks")}


def test_ten_concurrent_ticks_submit_each_trial_once(dev_cluster, isolated_ledger, tmp_path):
    # The trials run until the ticks are done: every tick then finds the sweep running, however slow it is.
    stop = tmp_path / "stop"
    spec = sweep_spec(tmp_path, "tenticks", 'method = "random"\nmax_trials = 12\nmax_parallel = 12\n'
                      '[search]\nx = { type = "uniform", low = -2.0, high = 2.0 }\ny = { type = "uniform", low = -2.0, high = 2.0 }',
                      steps=3000, step_s=0.1, stop_file=stop)
    assert run_cli("sweep", "start", str(spec), "--no-tick").returncode == 0
    ticks = [subprocess.Popen([*HPCTRAIN, "sweep", "tick"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(10)]
    outs = [p.communicate(timeout=300) for p in ticks]
    assert all(p.returncode == 0 for p in ticks), [o[1] for o in outs]
    assert sorted(o[0].split(":")[1].split(",")[0].strip() for o in outs) == ["0 submitted"] * 9 + ["12 submitted"]
    with Ledger(isolated_ledger) as ledger:
        trials = Table(ledger, "trials").rows(order_by="number")
        jobs = ledger.jobs.of_sweep("tenticks")
    assert [t["number"] for t in trials] == list(range(12)) and len(jobs) == 1
    assert sorted((t["job_id"], t["task_index"]) for t in trials) == [(jobs[0]["id"], k) for k in range(12)]
    stop.touch()
    # Slurm agrees: one array of 12 tasks, each run once.
    wait_until(lambda: run_cli("sweep", "tick").returncode == 0 and _all_completed(isolated_ledger), 180, 2,
               "the trials to complete")
    sacct = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State", "-j", jobs[0]["slurm_job_id"]],
                           capture_output=True, text=True, check=True).stdout.split()
    assert sorted(sacct) == sorted(f"{jobs[0]['slurm_job_id']}_{k}|COMPLETED" for k in range(12))
    # Nothing is due any more: another tick changes nothing, and the sweep is done.
    before = snapshot(isolated_ledger)
    assert "0 submitted, 0 resubmitted, 0 stopped early; DONE" in run_cli("sweep", "tick", "tenticks").stdout
    assert snapshot(isolated_ledger)["trials"] == before["trials"]
    status = json.loads(run_cli("sweep", "status", "tenticks", "--json").stdout)
    best = min(t["value"] for t in status["trials"])
    assert status["state"] == "DONE" and status["best"]["value"] == best
    x, y = status["best"]["params"]["x"], status["best"]["params"]["y"]
    assert best == pytest.approx((x - 0.3) ** 2 + (y + 0.2) ** 2)


def _all_completed(ledger_path: Path) -> bool:
    with Ledger(ledger_path) as ledger:
        return {t["state"] for t in Table(ledger, "trials").rows()} == {"completed"}


def test_a_tick_with_slurmctld_down_fails_in_one_line_and_changes_nothing(dev_cluster, isolated_ledger, tmp_path):
    # The trials run until the test is done: the last tick finds both running, however fast a trial would be.
    stop = tmp_path / "stop"
    spec = sweep_spec(tmp_path, "ctlddown", 'method = "grid"\nmax_parallel = 2\n[search]\nx = { type = "choice", values = [0.0, 0.5, 1.0] }\ny = { type = "choice", values = [0.0] }',
                      steps=3000, step_s=0.1, stop_file=stop)
    assert run_cli("sweep", "start", str(spec), "--no-tick").returncode == 0
    before = snapshot(isolated_ledger)
    subprocess.run([DEV_CLUSTER, "stop-daemon", "slurmctld"], check=True, capture_output=True)
    try:
        down = run_cli("sweep", "tick")
    finally:
        subprocess.run([DEV_CLUSTER, "up"], check=True, capture_output=True)
    assert down.returncode == 2 and down.stdout == ""
    assert len(down.stderr.splitlines()) == 1 and down.stderr.startswith("hpctrain: error: scontrol ping"), down.stderr
    assert snapshot(isolated_ledger) == before
    # Back up: the next ticks go on, each trial once.
    assert "2 submitted" in run_cli("sweep", "tick").stdout
    assert "0 submitted" in run_cli("sweep", "tick").stdout
    stop.touch()
    with Ledger(isolated_ledger) as ledger:
        assert [t["number"] for t in Table(ledger, "trials").rows()] == [0, 1]


@lanes(why="pruning is optuna's and hpctrain's; its scancel is every other test's")
def test_early_stopping_cancels_trials_behind_the_median(dev_cluster, isolated_ledger, tmp_path):
    """Five trials with flat curves at loss x + const: at each step, x = 3.3 and 4.3 are worse than the median
    of the others and are cancelled; once they stop reporting, 2.3 is worse than the median of 0.3 and 1.3 and
    follows; 1.3 then has one other trial, fewer than min_trials, and completes with 0.3. The trials run until
    those three are pruned, however slow the ticks are: none can end while a tick decides on it."""
    stop = tmp_path / "stop"
    spec = sweep_spec(tmp_path, "median", 'method = "grid"\nmax_parallel = 5\n'
                      '[search]\nx = { type = "choice", values = [0.3, 1.3, 2.3, 3.3, 4.3] }\ny = { type = "choice", values = [-0.2] }\n'
                      '[early_stopping]\nrule = "median"\ngrace_steps = 3\nmin_trials = 2', steps=3000, step_s=1.0,
                      stop_file=stop)
    assert run_cli("sweep", "start", str(spec)).returncode == 0

    def pruned_ones() -> set[float]:
        with Ledger(isolated_ledger) as ledger:
            rows = Table(ledger, "trials").rows()
        return {json.loads(t["params_json"])["x"] for t in rows if t["state"] == "pruned"}

    # A step a second: each tick has five records a second to fold in, which a busy machine keeps up with.
    wait_until(lambda: run_cli("sweep", "tick", "median").returncode == 0 and pruned_ones() == {2.3, 3.3, 4.3},
               600, 2, "x = 2.3, 3.3 and 4.3 to be pruned")
    stop.touch()
    wait_until(lambda: "DONE" in run_cli("sweep", "tick", "median").stdout, 240, 2, "the sweep to finish")
    with Ledger(isolated_ledger) as ledger:
        trials = {json.loads(t["params_json"])["x"]: t for t in Table(ledger, "trials").rows()}
        slurm_id = ledger.jobs.get(trials[0.3]["job_id"])["slurm_job_id"]
    assert {x: t["state"] for x, t in trials.items()} == {0.3: "completed", 1.3: "completed", 2.3: "pruned",
                                                          3.3: "pruned", 4.3: "pruned"}
    assert all(t["reason"].startswith("median stopping") for t in trials.values() if t["state"] == "pruned")

    def task_states() -> dict[int, str]:
        out = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", slurm_id], capture_output=True,
                             text=True, check=True).stdout
        rows = (line.split("|") for line in out.splitlines())
        return {int(task.split("_")[1].strip("[]")): state.split()[0] for task, state in rows}

    # A pruned trial is final in the ledger at once; its task's end reaches accounting when the task is gone.
    wait_until(lambda: TERMINAL.issuperset(task_states().values()), 120, 1, "accounting to record every task's end")
    states = task_states()
    pruned = {t["task_index"] for t in trials.values() if t["state"] == "pruned"}
    assert {task for task, state in states.items() if state == "CANCELLED"} == pruned, sorted(states.items())


def test_one_broken_sweep_leaves_the_cron_tick_to_the_others(dev_cluster, isolated_ledger, tmp_path):
    """A sweep whose trials cannot be submitted (its job names an account the user lacks) is marked FAILED in
    one line and the tick exits 1 for cron's mail; the sweep registered after it still gets its trials, and
    later ticks leave the broken one out."""
    grid = ('method = "grid"\nmax_parallel = 2\n[search]\nx = { type = "choice", values = [0.0, 0.5] }\n'
            'y = { type = "choice", values = [0.0] }')
    broken = sweep_spec(tmp_path, "broken", grid)
    broken.write_text(broken.read_text().replace('account = "teama"', 'account = "teamz"'))
    for spec in (broken, sweep_spec(tmp_path, "healthy", grid)):
        assert run_cli("sweep", "start", str(spec), "--no-tick").returncode == 0
    first = run_cli("sweep", "tick")
    assert first.returncode == 1, first.stderr
    assert first.stderr.startswith("hpctrain: error: sweep broken: ") and first.stderr.count("\n") == 1
    assert "'teamz'" in first.stderr and "Traceback" not in first.stderr
    assert "sweep healthy: 2 submitted" in first.stdout
    later = run_cli("sweep", "tick")
    assert later.returncode == 0 and "broken" not in later.stdout + later.stderr
    with Ledger(isolated_ledger) as ledger:
        states = {s["id"]: s["state"] for s in Table(ledger, "sweeps").rows()}
        assert states["broken"] == "FAILED" and states["healthy"] in ("ACTIVE", "DONE")
        assert "SUBMITTING" not in {j["state"] for j in Table(ledger, "jobs").rows()}
