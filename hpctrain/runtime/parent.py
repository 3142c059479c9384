"""A child process that must not outlive its parent: Linux's parent-death signal, for data-loader workers and
the entry point under each rank's task shim (left behind, either keeps the rank's gloo sockets and its job step
alive)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux only); exit at once if it is dead already."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() == 1:  # the parent died before the line above
            os._exit(1)
