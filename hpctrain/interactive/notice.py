"""The IPython extension a session's kernels load: a stop notice (preemption, the time limit) shows as a message
under the cell that ran last, before the grace time ends."""

from __future__ import annotations

import signal
import sys
import time
from typing import Any

NOTICE_SIGNAL = signal.SIGUSR2
REPEAT_S = 5.0  # the notice can arrive twice (from Slurm to the whole step, and passed on by the server)
MESSAGE = (
    "hpctrain: this session got a stop notice at {at} (preemption or its time limit): it ends soon, save your work now"
)


def load_ipython_extension(ipython: Any) -> None:
    last = [0.0]

    def notice(signum: int, frame: Any) -> None:
        if time.monotonic() - last[0] > REPEAT_S:
            last[0] = time.monotonic()
            print(MESSAGE.format(at=time.strftime("%H:%M:%S")), file=sys.stderr, flush=True)

    signal.signal(NOTICE_SIGNAL, notice)
