"""The hang watchdog of one rank (hpctrain.runtime.watchdog), outside Slurm: a rank stuck in a phase leaves
its stacks and exits; one that keeps going leaves nothing to report."""

import os
import subprocess
import sys

from hpctrain.contract import JobEnvironment
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.watchdog import HUNG_EXIT, hang_report, unreported_hang

RANK = """\
import time
from hpctrain.runtime.watchdog import Watchdog

def stuck_in_step(seconds):
    time.sleep(seconds)

w = Watchdog()
w.phase("start-up", 30)
for step in range(3):
    w.phase("step", {timeout})
    stuck_in_step(0.01 if step < 2 else {last})
w.close()
"""


def run_rank(tmp_path, restart: str, timeout: float, last: float, **slurm: str) -> tuple[int, dict[str, str]]:
    env = {**os.environ, "HPCTRAIN_JOB_DIR": str(tmp_path), "RANK": "1", "SLURM_RESTART_COUNT": "0",
           "HPCTRAIN_STEP_RESTART": restart, **slurm}
    done = subprocess.run([sys.executable, "-c", RANK.format(timeout=timeout, last=last)], env=env, timeout=60,
                          capture_output=True, text=True)
    return done.returncode, env


def test_a_rank_stuck_in_a_step_leaves_its_stack_and_exits(tmp_path):
    rc, env = run_rank(tmp_path, "0", timeout=0.5, last=30)
    assert rc == HUNG_EXIT
    assert hang_report(JobEnvironment(env)) == (
        f"hung in phase step, timeout 0.5 s: rank 1 (<string>:5 in stuck_in_step); stacks in {tmp_path / 'stacks'}")


def test_a_rank_that_keeps_going_is_not_reported(tmp_path):
    rc, env = run_rank(tmp_path, "1", timeout=5, last=0.01)
    assert rc == 0
    assert hang_report(JobEnvironment(env)) is None
    assert hang_report(JobEnvironment({"HPCTRAIN_JOB_DIR": str(tmp_path / "none")})) is None


def test_a_hang_is_decided_before_the_rank_exits_and_journaled_once(tmp_path):
    """The watchdog makes its step's failure marker as a hang before it exits (the peers that fail on the connection
    it leaves find it made); the batch script journals the hang once, however many times it asks."""
    rc, env = run_rank(tmp_path, "0", timeout=0.5, last=30, SLURM_JOB_ID="77", SLURM_STEP_ID="0")
    assert rc == HUNG_EXIT
    job = JobEnvironment(env)
    assert (tmp_path / "failed" / job.step_id).read_text().startswith("hang: rank 1 on ")
    journal = Journal(tmp_path / "journal")
    report = unreported_hang(journal, job)
    assert report is not None and report.startswith("hung in phase step")
    journal.write("hang", attempt=job.run_number, step_restart=job.step_restarts, message=report)
    assert unreported_hang(journal, job) is None
