"""Hang detection for one rank: each phase (start-up, a step) must end within the spec's `[hang]` timeout,
else every thread's Python stack goes to a file in the job's stacks folder and, a moment later, the rank
exits with status HUNG_EXIT, so srun (--kill-on-bad-exit) ends the job step and the batch script restarts it in
the allocation (retry.in_place) or ends the run; `hang_report` tells the batch script what was found.

The stacks are written by faulthandler's timer, a C thread: it fires whether the rank sleeps, waits in a
collective whose peer is gone, or spins in C code holding the GIL. The exit comes EXIT_AFTER_S later
from a Python thread, so that the other ranks, stuck waiting on this one and timing out together, have
written their stacks too before srun ends them all. Each phase's deadline also goes to the rank's heartbeat
file (hpctrain.runtime.heartbeat), where the task shim finds a rank whose threads cannot run at all (stopped)
and has it write its stacks on DUMP_SIGNAL, to a file of their own (the phase's timer, continued too, may write
at the same moment), before ending it.

The reference trainer times its start-up and steps; a user's loop is timed through `PreemptionGuard`, each
`should_stop()` call ending one step and starting the next.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hpctrain.contract import JobEnvironment, JobPaths
from hpctrain.ledger.journal import Journal
from hpctrain.runtime import blame
from hpctrain.runtime.heartbeat import Heartbeat

if TYPE_CHECKING:
    from hpctrain.config.policies import HangPolicy

EXIT_AFTER_S = 3.0  # from the stacks to the exit: time for the peers stuck on this rank to write theirs
# A stopped rank's own report, added to its stack file by its task shim: `hang_report` names it the stuck one.
STOPPED = "stopped (process state T)"
# The task shim's report of a job whose log stayed quiet past [hang] output_s (code that asks no guard).
QUIET = "hung: the job's log gained nothing"
# ... and of a rank it found stopped under [hang] output_s: its output stopped with it.
SILENCED = "hung: its output stopped with it"
# Writes a watched rank's stacks at once (Java's thread dump signal; USR1 is NCCL's, USR2 the notice).
DUMP_SIGNAL = signal.SIGQUIT
# A hung rank's exit status (timeout(1)'s): every rank of a hung step times out, so none is blamed for its node.
HUNG_EXIT = 124


def stacks_prefix(env: JobEnvironment) -> str:
    """This job step's stack files begin with this: `[task<T>-]run<N>.<step restart>-`."""
    task = f"task{env.task_index}-" if env.task_index >= 0 else ""
    return f"{task}run{env.run_number}.{env.step_restarts}-"


def stacks_file(env: JobEnvironment, stopped: bool = False) -> Path | None:
    """This rank's stack file for this job step (``stopped``: the one written on DUMP_SIGNAL); None outside an
    hpctrain job."""
    if env.job_dir is None:
        return None
    return JobPaths(env.job_dir).stacks_dir / f"{stacks_prefix(env)}{'stopped-' * stopped}rank{env.rank}.txt"


class Watchdog:
    """Arms one timer per phase; `phase()` at each phase's start, `close()` when the rank is done."""

    def __init__(self, env: JobEnvironment | None = None) -> None:
        self.env = env = env or JobEnvironment()
        self.file: IO[str] | None = None
        self.dump_file: IO[str] | None = None
        self.current = ""
        self.deadline: float | None = None
        self.heartbeat = Heartbeat.open(env.heartbeat_file) if env.heartbeat_file and env.job_dir else None
        if (path := stacks_file(env)) is not None:
            path.parent.mkdir(exist_ok=True)
            self.file = open(path, "a", encoding="utf-8")
            if self.heartbeat and (dump := stacks_file(env, stopped=True)):
                self.dump_file = open(dump, "a", encoding="utf-8")
                # chain: the signal's own action follows the stacks (SIGQUIT's default ends the process), so a
                # stopped rank continued for its stacks runs none of its code again (hpctrain.launch.rankwatch).
                # A job started in the background of a non-interactive shell inherits SIGQUIT ignored: the chained
                # action would then be nothing, and the rank would run on after its stacks.
                if signal.getsignal(DUMP_SIGNAL) == signal.SIG_IGN:
                    with contextlib.suppress(ValueError):  # not the main thread: it may not set a disposition
                        signal.signal(DUMP_SIGNAL, signal.SIG_DFL)
                faulthandler.register(DUMP_SIGNAL, file=self.dump_file, all_threads=True, chain=True)
            threading.Thread(target=self._exit_when_hung, name="hpctrain-watchdog", daemon=True).start()
            # A rank whose code has returned is not in a step: its exit (other atexit handlers, the modules' teardown,
            # seconds on a loaded machine) is not timed as one.
            atexit.register(self.close)

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
        if self.heartbeat:
            self.heartbeat.write(self.deadline or 0, name)

    def close(self) -> None:
        if self.file is not None:
            atexit.unregister(self.close)
            faulthandler.cancel_dump_traceback_later()
            if self.dump_file:
                faulthandler.unregister(DUMP_SIGNAL)
                self.dump_file.close()
                self.dump_file = None
            self.deadline = None
            self.file.close()
            self.file = None
        if self.heartbeat:
            self.heartbeat.write(0, "")
            self.heartbeat.close()
            self.heartbeat = None

    def _exit_when_hung(self) -> None:
        while self.file is not None:
            deadline = self.deadline
            if deadline is not None and time.monotonic() > deadline + EXIT_AFTER_S:
                blame.claim(blame.HANG, self.env)  # before the exit: the peers it fails then blame no node
                os._exit(HUNG_EXIT)
            time.sleep(0.5)


def hang_timeouts(spec: Any) -> HangPolicy:
    """The spec's [hang] timeouts, the site's where it sets none."""
    from hpctrain.config.policies import HangPolicy
    from hpctrain.config.site import job_site

    site = job_site()
    return spec.hang.over(site.hang if site else HangPolicy())


def job_hang_timeouts(env: JobEnvironment | None = None) -> HangPolicy:
    """This job's `hang_timeouts`, from the spec its batch script names; none (0) outside an hpctrain job."""
    from hpctrain.config.job import load_job_spec
    from hpctrain.config.policies import HangPolicy

    env = env or JobEnvironment()
    if env.job_dir is None or env.spec_file is None:
        return HangPolicy().over(HangPolicy())
    return hang_timeouts(load_job_spec(env.spec_file))


class RankWatchdog:
    """This rank's hang watchdog, each phase armed with its timeout of ``hang`` (none when both are 0)."""

    TIMEOUTS = {"start-up": "startup_s", "step": "step_s"}  # phase -> its HangPolicy field

    def __init__(self, hang: HangPolicy) -> None:
        self.hang = hang
        self.watchdog = Watchdog() if self.hang.startup_s or self.hang.step_s else None

    def phase(self, name: str) -> None:
        """Start phase ``name`` ('start-up' or 'step') under its timeout."""
        if self.watchdog:
            self.watchdog.phase(name, getattr(self.hang, self.TIMEOUTS[name]))

    def close(self) -> None:
        if self.watchdog:
            self.watchdog.close()


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (\S+)')


def _innermost_frame(text: str) -> str | None:
    """Where the main thread of a faulthandler dump was ('train.py:88 in step'); None without a dump. Frames of
    hpctrain's runtime (the guard's heartbeat, this watchdog) are passed over for the code that called them: a
    rank stopped while its loop asked ``should_stop()`` is named at the loop's line, not inside the guard."""
    main = re.split(r"^(?:Current thread|Thread) ", text, flags=re.M)[-1]  # the main thread comes last
    frames = [m for ln in main.splitlines() if (m := _FRAME.match(ln))]
    frame = next(
        (m for m in frames if Path(m[1]).parent.parts[-2:] != ("hpctrain", "runtime")), frames[0] if frames else None
    )
    return f"{Path(frame[1]).name}:{frame[2]} in {frame[3]}" if frame else None


def hang_report(env: JobEnvironment) -> str | None:
    """One line on the ranks of this job step that timed out, with where each main thread was (its
    innermost frame) and the stack files, a rank found stopped first (the stuck one: its peers waited on it);
    None when none did."""
    if env.job_dir is None:
        return None
    found: list[tuple[bool, int, str]] = []
    quiet: list[tuple[bool, str]] = []  # the task shims' own reports under output_s: a stopped rank's first
    phase = ""
    folder = JobPaths(env.job_dir).stacks_dir
    for path in folder.glob(f"{stacks_prefix(env)}rank*.txt") if folder.is_dir() else []:
        text = path.read_text(encoding="utf-8", errors="replace")
        if line := next((ln for ln in text.splitlines() if QUIET in ln or SILENCED in ln), None):
            quiet.append((SILENCED not in line, line.removeprefix("hpctrain: ")))
            continue
        was_stopped = STOPPED in text
        if "most recent call first" not in text and not was_stopped:
            continue  # armed, never fired
        phase = [ln for ln in text.splitlines() if ln.startswith("phase ")][-1].rsplit(", from", 1)[0]
        dump = path.with_name(path.name.replace("rank", "stopped-rank", 1))
        where = (
            _innermost_frame(dump.read_text(encoding="utf-8", errors="replace"))
            if was_stopped and dump.exists()
            else _innermost_frame(text)
        )
        rank = int(path.stem.rsplit("rank", 1)[1])
        found.append(
            (not was_stopped, rank, f"rank {rank} ({'stopped by a signal, ' * was_stopped}{where or 'no stack'})")
        )
    if quiet:
        return "; ".join(line for _, line in sorted(quiet))
    if not found:
        return None
    return f"hung in {phase}: {'; '.join(line for *_, line in sorted(found))}; stacks in {folder}"


def unreported_hang(journal: Journal, env: JobEnvironment) -> str | None:
    """`hang_report` of this job step, unless its journal has a ``hang`` record of it already (one per hang: the
    batch script's `attempt restart` journals it, and `attempt end` too when no restart followed)."""
    for _, rec in journal.records(kinds=("hang",)):
        if (rec.get("attempt"), rec.get("step_restart"), rec.get("task_index", -1)) == (
            env.run_number,
            env.step_restarts,
            env.task_index,
        ):
            return None
    return hang_report(env)
