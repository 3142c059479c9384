"""The reference trainer behind a checkpoint file system that slows down: from step FROM on, each rank's part of
a save takes DELAY_S longer to write (the background write, so the commit is late, not the step).

    python -m helpers.slow_saves FROM DELAY_S ARG...      (ARG...: the trainer's own arguments)
"""

from __future__ import annotations

import runpy
import sys
import time

from hpctrain.checkpoint.checkpointer import Checkpointer


def main() -> None:
    start, delay = int(sys.argv[1]), float(sys.argv[2])
    write = Checkpointer._write_and_commit

    def slowed(self, snapshot, step, *args, **kwargs):
        if step >= start:
            time.sleep(delay)
        return write(self, snapshot, step, *args, **kwargs)

    Checkpointer._write_and_commit = slowed
    sys.argv = ["hpctrain.train", *sys.argv[3:]]
    runpy.run_module("hpctrain.train", run_name="__main__")


if __name__ == "__main__":
    main()
