"""kill -9 at random moments of saving: the newest valid checkpoint is always whole and loadable.

One writer process per trial (two ranks, as threads, each writing its row shards) resumes from the
checkpoint directory the previous trial left (checking what it loads), then saves step after step
(sync and async, with retention deleting old ones) until SIGKILLed at a random moment.
See benchmarks/checkpoint_crash.py for more trials, each killing a single save.
"""

import random
import time

from hpctrain.checkpoint import latest_valid
from hpctrain.checkpoint.naming import list_dirs

from helpers.checkpoint import check_checkpoint, start_crash_writer
from helpers.waiting import wait_until

TRIALS = 12  # each a fresh interpreter importing tensorstore: 60 took 586 s of CI, 24 took 383 s
WORLD = 2


def check_directory(directory) -> int:
    """Every committed directory verifies and holds its own step's state; returns the newest step."""
    committed = list_dirs(directory)
    assert committed, "no checkpoint left"
    for d in committed:
        check_checkpoint(d.path, d.step, WORLD)
    assert latest_valid(directory) == committed[-1].path
    leftovers = [d for d in list_dirs(directory, kind=None) if d.kind != "committed"]
    assert len({d.tag.rpartition(".")[0] for d in leftovers}) <= 1, f"unfinished saves pile up: {leftovers}"
    return committed[-1].step


def test_sigkill_at_random_moments_never_leaves_a_partial_checkpoint(tmp_path):
    rng = random.Random(1234)
    directory = tmp_path / "ck"
    steps = [0]
    for trial in range(TRIALS):
        child = start_crash_writer(directory, WORLD)
        if trial % 2:  # every other kill comes after a save of this run committed: progress on a busy machine too
            wait_until(lambda: list_dirs(directory)[-1].step > steps[-1], 120, 0.01, "a save to commit")
        time.sleep(rng.uniform(0, 0.3))
        child.kill()
        child.wait()
        steps.append(check_directory(directory))
    assert steps == sorted(steps), f"the newest valid checkpoint went back: {steps}"
    assert steps[-1] >= TRIALS // 2
