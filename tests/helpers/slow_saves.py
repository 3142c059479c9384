"""The reference trainer behind a checkpoint file system that slows down: after its first AFTER saves, each rank's
part of a save takes DELAY_S longer to write (the background write, so the commit is late, not the step). Counted
in saves, not steps: how many steps apart "auto" saves depends on how fast the machine runs them.

    python -m helpers.slow_saves AFTER DELAY_S ARG...      (ARG...: the trainer's own arguments)
"""

from __future__ import annotations

import runpy
import sys
import time

from hpctrain.checkpoint.checkpointer import Checkpointer


def main() -> None:
    after, delay = int(sys.argv[1]), float(sys.argv[2])
    write, saves = Checkpointer._write_and_commit, [0]

    def slowed(self, snapshot, step, *args, **kwargs):
        saves[0] += 1
        if saves[0] > after:
            time.sleep(delay)
        return write(self, snapshot, step, *args, **kwargs)

    Checkpointer._write_and_commit = slowed
    sys.argv = ["hpctrain.train", *sys.argv[3:]]
    runpy.run_module("hpctrain.train", run_name="__main__")


if __name__ == "__main__":
    main()
