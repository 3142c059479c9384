"""A rank's heartbeat, read from outside the rank: the deadline by which its current phase must end, which the
rank's watchdog (hpctrain.runtime.watchdog) writes to a small node-local file at each phase and its task shim
(hpctrain.launch.task) reads. A rank that cannot act for itself is found this way: one stopped by SIGSTOP has
every thread frozen, its watchdog's too.

The file is the shim's memfd, which the rank opens through /proc: it lives in memory and goes with the last
process that holds it, so a beat is a write, never I/O, and a killed shim leaves nothing behind. The deadline
is on the monotonic clock, which every process of a host shares; 0 means no phase is timed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

RECORD = 64  # bytes: one record, rewritten in place at offset 0
NAME = "hpctrain-heartbeat"  # the memfd's


@dataclass(frozen=True)
class Beat:
    deadline: float  # time.monotonic() by which the phase must end; 0: none timed
    phase: str


def create() -> tuple[int, str]:
    """A new heartbeat file: its descriptor (the reading end) and the path the rank opens it by."""
    fd = os.memfd_create(NAME, os.MFD_CLOEXEC)
    return fd, f"/proc/{os.getpid()}/fd/{fd}"


class Heartbeat:
    """The writing end, kept open: `write` is one pwrite."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, path: Path) -> Heartbeat | None:
        """The heartbeat file at ``path`` if it is the shim's (a memfd of that name; a process of another PID
        namespace may own that /proc path); else None."""
        try:
            if not os.readlink(path).startswith(f"/memfd:{NAME}"):
                return None
            return cls(os.open(path, os.O_WRONLY))
        except OSError:
            return None

    def write(self, deadline: float, phase: str) -> None:
        os.pwrite(self.fd, f"{deadline:.3f} {phase}"[: RECORD - 1].ljust(RECORD - 1).encode() + b"\n", 0)

    def close(self) -> None:
        os.close(self.fd)


def read(fd: int) -> Beat | None:
    """The rank's last beat; None before its first (or, rarely, a record read while being rewritten)."""
    try:
        deadline, _, phase = os.pread(fd, RECORD, 0).decode("ascii").strip().partition(" ")
        return Beat(float(deadline), phase)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
