"""The task shim's watch over its rank (hpctrain.launch.task), from the rank's heartbeat file
(hpctrain.runtime.heartbeat). A rank past its phase's deadline whose process is stopped (SIGSTOP or SIGTSTP:
every thread frozen, its own watchdog's too) is hung: the shim notes it as stopped in the rank's stack file, has
it write its stacks to their own file (DUMP_SIGNAL, then SIGCONT so that it can) and kills it. A rank still alive
KILL_AFTER_S after its own watchdog should have ended it is killed too. The shim then ends with HUNG_EXIT, as for
a rank its watchdog ended.

The stopped rank is found within POLL_S of its deadline, before the peers waiting on it end theirs
(EXIT_AFTER_S) and srun ends the step.

For code that asks no guard (no heartbeat), `[hang] output_s` is the fallback: rank 0's shim watches the job's
log, and once it has gained nothing for that long ends the rank with SIGABRT, on which a Python entry point
(PYTHONFAULTHANDLER, set by the shim) writes every thread's stack to the log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hpctrain.runtime.heartbeat import read
from hpctrain.runtime.watchdog import DUMP_SIGNAL, EXIT_AFTER_S, QUIET, STOPPED

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
        self,
        child: subprocess.Popen[bytes],
        heartbeat: int,
        stacks: Path | None,
        dump: Path | None,
        rank: int,
        log: Path | None = None,
        quiet_s: float = 0.0,
    ) -> None:
        """``stacks``: the rank's stack file, ``dump``: the one it writes on DUMP_SIGNAL; ``log``: the job's log,
        which may gain nothing for ``quiet_s`` at most (0: not watched)."""
        self.child, self.heartbeat, self.stacks, self.dump, self.rank = child, heartbeat, stacks, dump, rank
        self.log, self.quiet_s = log, quiet_s
        self.log_size, self.log_changed = self._size(log), time.monotonic()
        self.hung = False
        threading.Thread(target=self._watch, name="hpctrain-rank-watch", daemon=True).start()

    def _note(self, text: str) -> None:
        """In the rank's stack file (the batch script's hang report reads it), and in the log."""
        line = f"hpctrain: rank {self.rank} {text}\n"
        print(line, end="", file=sys.stderr, flush=True)
        if self.stacks is not None:
            try:
                self.stacks.parent.mkdir(exist_ok=True)
                with open(self.stacks, "a", encoding="utf-8") as f:
                    f.write(line)
            except OSError as exc:
                print(f"hpctrain: could not write {self.stacks}: {exc}", file=sys.stderr, flush=True)

    @staticmethod
    def _size(path: Path | None) -> int:
        try:
            return path.stat().st_size if path is not None else 0
        except OSError:
            return 0

    def _quiet_for(self) -> float:
        """Seconds since the job's log last grew."""
        size = self._size(self.log)
        if size != self.log_size:
            self.log_size, self.log_changed = size, time.monotonic()
        return time.monotonic() - self.log_changed

    def _watch(self) -> None:
        while self.child.poll() is None:
            time.sleep(POLL_S)
            if self.quiet_s and (quiet := self._quiet_for()) > self.quiet_s:
                self._note(f"{QUIET} for {quiet:.0f} s ([hang] output_s): its stacks to the log (SIGABRT), then killed")
                self._abort()
                return
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

    def _abort(self) -> None:
        """End a rank that asks no guard: SIGABRT, on which Python writes its stacks to stderr, then SIGKILL."""
        self.hung = True
        os.kill(self.child.pid, signal.SIGABRT)
        os.kill(self.child.pid, signal.SIGCONT)
        try:
            self.child.wait(DUMP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.child.kill()

    def _end(self, dump: bool) -> None:
        """Kill the rank, a stopped one once it has written its stacks (it runs again only for that)."""
        self.hung = True
        if dump:
            size = written = self._size(self.dump)
            os.kill(self.child.pid, DUMP_SIGNAL)  # handled as soon as the rank runs again, before its own code
            os.kill(self.child.pid, signal.SIGCONT)
            end = time.monotonic() + DUMP_WAIT_S
            while time.monotonic() < end:  # until the dump, written line by line, has begun and stopped growing
                time.sleep(0.05)
                size, before = self._size(self.dump), size
                if size == before and size > written:
                    break
        self.child.kill()
