"""kill -9 at random moments of saving: the newest valid checkpoint is always whole and loadable.

One writer process per trial resumes from the checkpoint directory the previous trial left (checking
what it loads), then saves step after step (sync and async, with retention deleting old ones) until
SIGKILLed at a random moment.
"""

import random
import subprocess
import sys
import time

from checkpoint_helpers import HERE, crash_state, same_bits
from hpctrain.checkpoint import latest_valid, load, verify
from hpctrain.checkpoint.naming import list_dirs

TRIALS = 60


def check_directory(directory) -> int:
    """Every committed directory verifies and holds its own step's state; returns the newest step."""
    committed = list_dirs(directory)
    assert committed, "no checkpoint left"
    for d in committed:
        verify(d.path)
        state, expected = load(d.path, to="numpy"), crash_state(d.step)
        assert state["step"] == d.step
        assert all(same_bits(state[k][n], expected[k][n]) for k in ("model", "optim") for n in expected[k])
    newest = latest_valid(directory)
    assert newest == committed[-1].path
    assert len(list_dirs(directory, kind=None)) - len(committed) <= 2, "unfinished saves pile up"
    return committed[-1].step


def test_sigkill_at_random_moments_never_leaves_a_partial_checkpoint(tmp_path):
    rng = random.Random(1234)
    directory = tmp_path / "ck"
    steps = []
    for trial in range(TRIALS):
        child = subprocess.Popen([sys.executable, str(HERE / "checkpoint_helpers.py"), "crash-writer", str(directory)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = child.stdout.readline()
        if line != "ready\n":
            child.kill()
            raise AssertionError(f"trial {trial}: writer failed to resume:\n{child.communicate()[1]}")
        time.sleep(rng.uniform(0, 0.3))
        child.kill()
        child.wait()
        steps.append(check_directory(directory))
    assert steps[-1] > TRIALS // 2, f"too few saves happened between kills to test anything: {steps}"
