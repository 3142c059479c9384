"""A rank whose every thread is frozen (SIGSTOP): its task shim (hpctrain.launch.rankwatch) finds it past its
deadline from its heartbeat, notes it as stopped and continues it, so that its watchdog writes its stacks and ends
it; the hang report names it. The rank is a plain loop timed through hpctrain's guard, outside Slurm. And code
that asks no guard, under `[hang] output_s`: ended once the job's log stays quiet, its stacks in the log."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.contract import JobEnvironment
from hpctrain.runtime.watchdog import HUNG_EXIT, STOPPED, hang_report

from helpers.waiting import wait_until

LOOP = """\
import os, time
from hpctrain.runtime import PreemptionGuard

def train_step():
    time.sleep(0.02)

guard = PreemptionGuard()
print(os.getpid(), flush=True)
while not guard.should_stop():
    train_step()
"""


def job_env(tmp_path, step_s: float) -> dict[str, str]:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"name": "loop", "command": ["python", "loop.py"], "hang": {"step_s": step_s}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HPCTRAIN_", "SLURM_"))}
    return {**env, "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
            "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1", "HPCTRAIN_JOB_DIR": str(tmp_path),
            "HPCTRAIN_SPEC": str(spec)}


def test_a_stopped_rank_is_continued_to_write_its_stacks_and_named_as_stopped(tmp_path):
    env = job_env(tmp_path, step_s=1)
    shim = subprocess.Popen([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", LOOP], env=env,
                            stdout=subprocess.PIPE, text=True)
    rank = int(shim.stdout.readline())
    time.sleep(0.3)  # a few steps
    os.kill(rank, signal.SIGSTOP)
    assert shim.wait(60) == HUNG_EXIT
    stacks = (tmp_path / "stacks" / "run0.0-rank0.txt").read_text()
    assert STOPPED in stacks and "still running" not in stacks
    # Its stacks as it was stopped, written on the shim's signal to a file of their own: the phase's timer, continued
    # with it, may write its own at the same moment.
    dump = (tmp_path / "stacks" / "run0.0-stopped-rank0.txt").read_text()
    assert dump.count("most recent call first") == 2  # the main thread and the watchdog's
    # The user's code, wherever the stop came: inside train_step, or at the loop's call of should_stop() (a loaded
    # machine stops it there more often: hpctrain's own frames are passed over)
    assert re.fullmatch(r"hung in phase step, timeout 1 s: rank 0 \(stopped by a signal, <string>:(5 in train_step|9 in "
                        rf"<module>)\); stacks in {re.escape(str(tmp_path / 'stacks'))}", hang_report(JobEnvironment(env)))
    wait_until(lambda: not os.path.exists(f"/proc/{rank}"), 10, 0.1, "the rank to be gone")


COUNTED = LOOP.replace("    train_step()\n", "    train_step()\n    steps.write('.')\n    steps.flush()\n").replace(
    "guard = PreemptionGuard()", "guard = PreemptionGuard()\nsteps = open('steps', 'a')")


def test_a_stopped_rank_runs_none_of_its_code_again_when_continued_for_its_stacks(tmp_path):
    """Issue 58.6: continued so that it could write its stacks, a stopped rank ran its own code until the shim killed
    it, and trained a step more. Its stacks now end it: as many steps after the stop as before. Even where it
    inherited SIGQUIT ignored, as a job started in the background of a non-interactive shell does (and CI's did)."""
    env = job_env(tmp_path, step_s=1)
    shim = subprocess.Popen([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", COUNTED],
                            env=env, stdout=subprocess.PIPE, text=True, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGQUIT, signal.SIG_IGN))
    rank = int(shim.stdout.readline())
    wait_until(lambda: (tmp_path / "steps").exists() and len((tmp_path / "steps").read_text()) >= 5, 30, 0.05,
               "a few steps")
    os.kill(rank, signal.SIGSTOP)
    # The stop takes effect when the rank next enters the kernel: counted once it has (state T), not before.
    wait_until(lambda: Path(f"/proc/{rank}/stat").read_text().rpartition(")")[2].split()[0] == "T", 10, 0.001,
               "the rank to stop")
    stopped_at = len((tmp_path / "steps").read_text())
    assert shim.wait(60) == HUNG_EXIT
    assert len((tmp_path / "steps").read_text()) == stopped_at
    assert "most recent call first" in (tmp_path / "stacks" / "run0.0-stopped-rank0.txt").read_text()
    assert not list(tmp_path.glob("core*"))


def test_a_rank_that_keeps_beating_runs_to_its_end(tmp_path):
    """Steps far shorter than the timeout: the guard's watch never fires, and the shim ends as the loop does; the
    stack files hold the phases only."""
    loop = LOOP.replace("while not guard.should_stop():", "for _ in range(40):\n    guard.should_stop()")
    done = subprocess.run([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", loop],
                          env=job_env(tmp_path, step_s=2), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert hang_report(JobEnvironment(job_env(tmp_path, step_s=2))) is None
    assert (tmp_path / "stacks" / "run0.0-stopped-rank0.txt").read_text() == ""


def test_a_rank_whose_exit_outlasts_the_step_timeout_is_not_hung(tmp_path):
    """Once the rank's code has returned its exit is not a step, however long it takes (an exit handler registered
    before the guard's runs after it: here it takes longer than the step's timeout, as a loaded machine's teardown
    once did)."""
    loop = LOOP.replace("guard = PreemptionGuard()", "import atexit\natexit.register(time.sleep, 2)\nguard = PreemptionGuard()")
    loop = loop.replace("while not guard.should_stop():", "for _ in range(5):\n    guard.should_stop()")
    done = subprocess.run([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", loop],
                          env=job_env(tmp_path, step_s=1), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert hang_report(JobEnvironment(job_env(tmp_path, step_s=1))) is None


SILENT = """\
import sys, time
for step in range(5):
    print("step", step, flush=True)
    time.sleep(0.1)
def waiting_forever():
    time.sleep(3600)
waiting_forever()
"""


def test_code_that_asks_no_guard_is_ended_when_the_jobs_log_goes_quiet(tmp_path):
    """`[hang] output_s = 1`: rank 0's shim watches the job's log (here the rank's own output, as srun's would be);
    a second after the last line the rank gets SIGABRT, Python writes its stacks there, and the step is hung."""
    env = {**job_env(tmp_path, step_s=0), "HPCTRAIN_HANG_OUTPUT_S": "1"}
    log = tmp_path / "slurm-77.out"
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", SILENT],
                              env=env, stdout=out, stderr=subprocess.STDOUT, timeout=60)
    assert done.returncode == HUNG_EXIT
    text = log.read_text()
    assert text.startswith("step 0\n") and "step 4\n" in text
    assert "Fatal Python error: Aborted" in text and 'line 6 in waiting_forever' in text
    report = hang_report(JobEnvironment(env))
    assert report.startswith("rank 0 hung: the job's log gained nothing for 1 s ([hang] output_s): its stacks to the log")


def test_the_report_names_the_code_that_called_into_the_guard():
    from hpctrain.runtime.watchdog import _innermost_frame

    dump = """Thread 0x01 (most recent call first):
  File "/usr/lib/python3/threading.py", line 331 in wait

Current thread 0x02 (most recent call first):
  File "/opt/venv/lib/python3.11/site-packages/hpctrain/runtime/watchdog.py", line 82 in phase
  File "/opt/venv/lib/python3.11/site-packages/hpctrain/runtime/guard.py", line 140 in should_stop
  File "/home/u/loop.py", line 9 in <module>
"""
    assert _innermost_frame(dump) == "loop.py:9 in <module>"
    own_only = dump.split("Current thread")[0] + 'Current thread 0x02:\n  File "/x/hpctrain/runtime/guard.py", line 5 in f\n'
    assert _innermost_frame(own_only) == "guard.py:5 in f"


BUFFERED = """\
import time
from pathlib import Path
for step in range(80):
    print("step", step)  # no flush: block-buffered when stdout is not a terminal
    time.sleep(0.05)
"""


def quiet_env(tmp_path, **hang) -> dict[str, str]:
    env = job_env(tmp_path, step_s=0)
    (tmp_path / "spec.json").write_text(json.dumps({"name": "loop", "command": ["python"], "hang": hang}))
    return {**{k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}, "HPCTRAIN_HANG_OUTPUT_S": str(hang["output_s"])}


def test_a_loop_whose_prints_are_not_flushed_is_not_hung(tmp_path):
    """`[hang] output_s = 2` and a loop that prints a line every 50 ms, for 4 s, without flushing: its Python runs
    unbuffered, so the log grows as it prints; the loop runs to its end with every line in the log."""
    log = tmp_path / "slurm-77.out"
    with log.open("w") as out:
        done = subprocess.run([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", BUFFERED],
                              env=quiet_env(tmp_path, output_s=2), stdout=out, stderr=subprocess.STDOUT, timeout=60)
    assert done.returncode == 0, log.read_text()
    assert log.read_text() == "".join(f"step {step}\n" for step in range(80))


def test_a_spec_can_keep_its_output_buffered(tmp_path):
    code = "import os; print(os.environ.get('PYTHONUNBUFFERED'), os.environ.get('PYTHONFAULTHANDLER'))"
    for hang, expected in (({"output_s": 30}, "1 1\n"), ({"output_s": 30, "buffered_output": True}, "None 1\n")):
        done = subprocess.run([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", code],
                              env=quiet_env(tmp_path, **hang), capture_output=True, text=True, timeout=60)
        assert done.stdout == expected, done.stderr


def test_a_rank_stopped_under_output_s_is_named_with_its_stacks(tmp_path):
    """`[hang] output_s = 2`, rank 1 (its shim does not watch the log) stopped by SIGSTOP: its shim ends it after half
    of output_s, before rank 0's would find the log quiet; its stacks go to its output, the report names it."""
    env = {**quiet_env(tmp_path, output_s=2), "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "2"}
    code = "import os, time\ndef training():\n    print(os.getpid(), flush=True)\n    time.sleep(3600)\ntraining()\n"
    shim = subprocess.Popen([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", code], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    os.kill(int(shim.stdout.readline()), signal.SIGSTOP)
    out, _ = shim.communicate(timeout=60)
    assert shim.returncode == HUNG_EXIT
    assert "Fatal Python error: Aborted" in out and " in training" in out  # stopped in it, at any load
    assert re.match(rf"rank 1 hung: its output stopped with it: {re.escape(STOPPED)} for \d+ s \(half of \[hang\] "
                    r"output_s\): its stacks to the log", hang_report(JobEnvironment(env)))
