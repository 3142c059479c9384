"""The task shim's watch over its rank (hpctrain.launch.task), from the rank's heartbeat file
(hpctrain.runtime.heartbeat). A rank past its phase's deadline whose process is stopped (SIGSTOP or SIGTSTP:
every thread frozen, its own watchdog's too) is hung: the shim notes it as stopped in the rank's stack file, has
it write its stacks to their own file (DUMP_SIGNAL, then SIGCONT so that it can) and kills it. A rank still alive KILL_AFTER_S
after its own watchdog should have ended it is killed too. The shim then ends with HUNG_EXIT, as for a rank its
watchdog ended.

The stopped rank is found within POLL_S of its deadline, before the peers waiting on it end theirs
(EXIT_AFTER_S) and srun ends the step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from hpctrain.runtime.heartbeat import read
from hpctrain.runtime.watchdog import DUMP_SIGNAL, EXIT_AFTER_S, STOPPED

POLL_S = 0.25
KILL_AFTER_S = 5.0
DUMP_WAIT_S = 2.0  # the most a continued rank is given to write its stacks


def stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (state T; a tracer's stop is t)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["T"]


class RankWatch:
    """Watches ``child`` (rank ``rank``, its heartbeat file open as ``heartbeat``) in a thread of its own; ``hung``
    once it had to be ended."""

    def __init__(
        self, child: subprocess.Popen[bytes], heartbeat: int, stacks: Path | None, dump: Path | None, rank: int
    ) -> None:
        """``stacks``: the rank's stack file, ``dump``: the one it writes on DUMP_SIGNAL."""
        self.child, self.heartbeat, self.stacks, self.dump, self.rank = child, heartbeat, stacks, dump, rank
        self.hung = False
        threading.Thread(target=self._watch, name="hpctrain-rank-watch", daemon=True).start()

    def _note(self, text: str) -> None:
        if self.stacks is not None:
            with open(self.stacks, "a", encoding="utf-8") as f:
                f.write(f"hpctrain: rank {self.rank} {text}\n")

    def _dump_size(self) -> int:
        try:
            return self.dump.stat().st_size if self.dump is not None else 0
        except OSError:
            return 0

    def _watch(self) -> None:
        while self.child.poll() is None:
            time.sleep(POLL_S)
            beat = read(self.heartbeat)
            if beat is None or not beat.deadline or (late := time.monotonic() - beat.deadline) < 0:
                continue
            if stopped(self.child.pid):
                self._note(
                    f"{STOPPED} {late:.1f} s past its {beat.phase} deadline (SIGSTOP or SIGTSTP): its stacks "
                    "as it was, then killed"
                )
                self._end(dump=True)
                return
            if late > EXIT_AFTER_S + KILL_AFTER_S:
                self._note(f"still running {late:.1f} s past its {beat.phase} deadline, its watchdog stuck: killed")
                self._end(dump=False)
                return

    def _end(self, dump: bool) -> None:
        """Kill the rank, a stopped one once it has written its stacks (it runs again only for that)."""
        self.hung = True
        if dump:
            size = written = self._dump_size()
            os.kill(self.child.pid, DUMP_SIGNAL)  # handled as soon as the rank runs again, before its own code
            os.kill(self.child.pid, signal.SIGCONT)
            end = time.monotonic() + DUMP_WAIT_S
            while time.monotonic() < end:  # until the dump, written line by line, has begun and stopped growing
                time.sleep(0.05)
                size, before = self._dump_size(), size
                if size == before and size > written:
                    break
        self.child.kill()
