"""The hang watchdog of one rank (hpctrain.runtime.watchdog), outside Slurm: a rank stuck in a phase leaves
its stacks and exits; one that keeps going leaves nothing to report."""

import os
import subprocess
import sys

from hpctrain.contract import JobEnvironment
from hpctrain.runtime.watchdog import HUNG_EXIT, hang_report

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


def run_rank(tmp_path, restart: str, timeout: float, last: float) -> tuple[int, dict[str, str]]:
    env = {**os.environ, "HPCTRAIN_JOB_DIR": str(tmp_path), "RANK": "1", "SLURM_RESTART_COUNT": "0",
           "HPCTRAIN_STEP_RESTART": restart}
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
