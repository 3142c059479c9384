"""Hang detection for one rank: each phase (start-up, a step) must end within the spec's `[hang]` timeout,
else every thread's Python stack goes to a file in the job's stacks folder and, a moment later, the rank
exits with status HUNG_EXIT, so srun (--kill-on-bad-exit) ends the job step and the batch script restarts it in
the allocation (retry.in_place) or ends the run; `hang_report` tells the batch script what was found.

The stacks are written by faulthandler's timer, a C thread: it fires whether the rank sleeps, waits in a
collective whose peer is gone, or spins in C code holding the GIL. The exit comes EXIT_AFTER_S later
from a Python thread, so that the other ranks, stuck waiting on this one and timing out together, have
written their stacks too before srun ends them all.
"""

from __future__ import annotations

import faulthandler
import os
import re
import threading
import time
from pathlib import Path
from typing import IO

from hpctrain.contract import JobEnvironment, JobPaths

EXIT_AFTER_S = 3.0  # from the stacks to the exit: time for the peers stuck on this rank to write theirs
# A hung rank's exit status (timeout(1)'s): every rank of a hung step times out, so none is blamed for its node.
HUNG_EXIT = 124


def stacks_prefix(env: JobEnvironment) -> str:
    """This job step's stack files begin with this: `[task<T>-]run<N>.<step restart>-`."""
    task = f"task{env.task_index}-" if env.task_index >= 0 else ""
    return f"{task}run{env.run_number}.{env.step_restarts}-"


class Watchdog:
    """Arms one timer per phase; `phase()` at each phase's start, `close()` when the rank is done."""

    def __init__(self, env: JobEnvironment | None = None) -> None:
        env = env or JobEnvironment()
        self.file: IO[str] | None = None
        self.current = ""
        self.deadline: float | None = None
        if env.job_dir is not None:
            folder = JobPaths(env.job_dir).stacks_dir
            folder.mkdir(exist_ok=True)
            self.file = open(folder / f"{stacks_prefix(env)}rank{env.rank}.txt", "a", encoding="utf-8")
            threading.Thread(target=self._exit_when_hung, name="hpctrain-watchdog", daemon=True).start()

    def phase(self, name: str, timeout_s: float) -> None:
        """Start phase ``name``: the rank is hung unless the next phase starts within ``timeout_s`` (0: off)."""
        if self.file is None:
            return
        faulthandler.cancel_dump_traceback_later()
        self.deadline = None
        if name != self.current:  # which phase hung, and its timeout, head the stacks (written once per change)
            self.file.write(f"phase {name}, timeout {timeout_s:g} s, from {time.time():.3f}\n")
            self.file.flush()
            self.current = name
        if timeout_s > 0:
            faulthandler.dump_traceback_later(timeout_s, repeat=False, file=self.file, exit=False)
            self.deadline = time.monotonic() + timeout_s

    def close(self) -> None:
        if self.file is not None:
            faulthandler.cancel_dump_traceback_later()
            self.deadline = None
            self.file.close()
            self.file = None

    def _exit_when_hung(self) -> None:
        while self.file is not None:
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline + EXIT_AFTER_S:
                os._exit(HUNG_EXIT)
            time.sleep(0.5)


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def hang_report(env: JobEnvironment) -> str | None:
    """One line on the ranks of this job step that timed out, with where each main thread was (its
    innermost frame) and the stack files; None when none did."""
    if env.job_dir is None:
        return None
    found = []
    folder = JobPaths(env.job_dir).stacks_dir
    for path in sorted(folder.glob(f"{stacks_prefix(env)}rank*.txt")) if folder.is_dir() else []:
        text = path.read_text(encoding="utf-8", errors="replace")
        if "most recent call first" not in text:
            continue  # armed, never fired
        phase = [ln for ln in text.splitlines() if ln.startswith("phase ")][-1].rsplit(", from", 1)[0]
        main = re.split(r"^(?:Current thread|Thread) ", text, flags=re.M)[-1]  # the main thread comes last
        frame = next((m for ln in main.splitlines() if (m := _FRAME.match(ln))), None)
        where = f"{Path(frame[1]).name}:{frame[2]} in {frame[3]}" if frame else "?"
        rank = path.stem.rsplit("rank", 1)[1]
        found.append(f"rank {rank} ({where})")
    if not found:
        return None
    return f"hung in {phase}: {'; '.join(found)}; stacks in {folder}"
