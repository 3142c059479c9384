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

import ctypes
import os
import platform
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from hpctrain.runtime import blame
from hpctrain.runtime.heartbeat import read
from hpctrain.runtime.watchdog import DUMP_SIGNAL, EXIT_AFTER_S, QUIET, SILENCED, STOPPED

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


_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def to_main_thread(pid: int, sig: int) -> None:
    """Send ``sig`` to the main thread of process ``pid`` (tgkill), not to whichever thread the kernel picks: where
    another thread took the stack-dump signal, the main thread, the user's loop, ran on while it wrote the stacks
    (5 steps, seen under CI load). Elsewhere than Linux on x86_64 or aarch64, to the process."""
    number = _SYS_TGKILL.get(platform.machine()) if sys.platform == "linux" else None
    if number is None or ctypes.CDLL(None, use_errno=True).syscall(number, pid, pid, sig) != 0:
        os.kill(pid, sig)


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
        stopped_s: float = 0.0,
    ) -> None:
        """``stacks``: the rank's stack file, ``dump``: the one it writes on DUMP_SIGNAL; ``log``: the job's log,
        which may gain nothing for ``quiet_s`` at most (0: not watched); the rank may stay stopped ``stopped_s`` at
        most whatever its heartbeat says (0: not watched)."""
        self.child, self.heartbeat, self.stacks, self.dump, self.rank = child, heartbeat, stacks, dump, rank
        self.log, self.quiet_s, self.stopped_s = log, quiet_s, stopped_s
        self.stopped_since: float | None = None
        self.last_poll = time.monotonic()
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

    def _stopped_for(self) -> float:
        """Seconds the rank has been seen stopped without a break (0: it runs). Seen between two polls only: a poll
        that comes late (the whole step suspended by Slurm, then resumed) starts the count again."""
        now, was = time.monotonic(), self.stopped_since
        if not stopped(self.child.pid):
            self.stopped_since = None
        elif was is None or now - self.last_poll > 4 * POLL_S:
            self.stopped_since = now
        self.last_poll = now
        return now - self.stopped_since if self.stopped_since is not None else 0.0

    def _watch(self) -> None:
        while self.child.poll() is None:
            time.sleep(POLL_S)
            if self.stopped_s and (frozen := self._stopped_for()) > self.stopped_s:
                self._note(
                    f"{SILENCED}: {STOPPED} for {frozen:.0f} s (half of [hang] output_s): its stacks to the log "
                    "(SIGABRT), then killed"
                )
                self._abort()
                return
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

    def _hung(self) -> None:
        """Decide the hang before the kill: the peers that fail because this rank is gone blame no node."""
        self.hung = True
        blame.claim(blame.HANG)

    def _abort(self) -> None:
        """End a rank that asks no guard: SIGABRT, on which Python writes its stacks to stderr, then SIGKILL."""
        self._hung()
        os.kill(self.child.pid, signal.SIGABRT)
        os.kill(self.child.pid, signal.SIGCONT)
        try:
            self.child.wait(DUMP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.child.kill()

    def _end(self, dump: bool) -> None:
        """Kill the rank; a stopped one ends itself once it has written its stacks, without running its own code
        again: DUMP_SIGNAL, pending while it is stopped, is handled first when it is continued, and its watchdog's
        handler then raises the signal again under its default action, which ends the process (with no core file:
        the shim sets the rank's core size to 0 first). A rank whose DUMP_SIGNAL was ignored or taken by its own
        handler is killed once it has written the stacks, or after DUMP_WAIT_S."""
        self._hung()
        if dump:
            size = written = self._size(self.dump)
            try:
                resource.prlimit(self.child.pid, resource.RLIMIT_CORE, (0, 0))
            except (OSError, ValueError):
                pass  # gone already, or a limit this user may not set: the kill below ends it all the same
            to_main_thread(self.child.pid, DUMP_SIGNAL)
            os.kill(self.child.pid, signal.SIGCONT)
            end = time.monotonic() + DUMP_WAIT_S
            while self.child.poll() is None and time.monotonic() < end:  # written line by line: until it stops growing
                time.sleep(0.05)
                size, before = self._size(self.dump), size
                if size == before and size > written:
                    break
        self.child.kill()
