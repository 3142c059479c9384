"""Notice preemption and time limits inside the job, and agree on them across ranks at a step boundary.

USR2 is the sbatch notice (`--signal=B:USR2@lead`, forwarded by hpctrain's batch script), SIGTERM
is what preemption sends on sites without user signals, SIGHUP covers a lost session. USR1 is
never used: NCCL takes it. Every rank calls `should_stop()` after each step; one all-reduce of a
single flag makes all of them stop at the same step, as Megatron does.

The batch script also writes each stop signal it gets to ``$HPCTRAIN_NOTICE_FILE``, which rank 0
looks at: a signal that reaches srun before it has started its tasks can be lost, and one that
reaches a task before its guard exists would end it.

In a job with `[hang]` timeouts the guard also watches the loop that asks it: from its creation to the
first `should_stop()` is the start-up (``startup_s``), from one call to the next a step (``step_s``); a rank
that stays silent longer writes its stacks and ends (hpctrain.runtime.watchdog), and its task shim finds one
that was stopped. `uninstall()` (or leaving a ``with`` block) ends the watch: what follows the loop (a final
evaluation, the export) is not a step.

`finish()` says the loop ran to its end: it ends the watch and journals the run's work as done, so that a notice
coming after the last step (during the export, or as the process exits) runs nothing again: the batch script
counts a run that finished and exited 0 as completed, as it does for hpctrain's trainer.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from hpctrain.contract import JobEnvironment
from hpctrain.ledger.journal import Journal
from hpctrain.parallel.collective import all_reduce_int
from hpctrain.runtime.watchdog import RankWatchdog, job_hang_timeouts

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def stop_signals_ignored() -> Iterator[None]:
    """Ignore the stop signals in this process and in every command it starts meanwhile (an ignored signal stays
    ignored across exec), as the batch script's bookkeeping does: Slurm signals every process of a job step, and a
    later copy of the notice (srun's pass of the batch shell's, the step's SIGTERM) would kill a requeue's scontrol
    half-way. Only the main thread can change handlers: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def notice_file(env: Mapping[str, str] = os.environ) -> Path | None:
    """Where the batch script writes down the stop signals it gets, on the one rank that looks (rank 0)."""
    job = JobEnvironment(env)
    return job.notice_file if job.rank == 0 else None


def timeout_margin_s(env: Mapping[str, str] = os.environ) -> float:
    """How near the job's end a stop counts as a time limit: twice the sbatch signal lead."""
    return 2 * JobEnvironment(env).signal_lead_s


LIMIT_REACHED_S = 10.0  # a job ending this near its computed end (StartTime + TimeLimit) reached its time limit


@dataclass
class JobNow:
    """This job as Slurm sees it now: its state, requeue count, when its time limit ends (epoch s), whether it is
    being preempted (its PreemptTime is set), its QOS, and whether it is ending because a preemption cancels it
    (PreemptMode=CANCEL: ending, preempted, and Slurm will not requeue it)."""

    state: str | None = None
    restarts: int | None = None
    end_time: float | None = None
    preempted: bool = False
    qos: str | None = None
    cancelled_by_preemption: bool = False


def stop_cause(now: JobNow | None, restarts_at_start: int, timeout_margin_s: float) -> str:
    """Why the job is told to stop, from its state rather than the signal: 'timeout' near its time limit;
    'cancelled' when it is ending without Slurm having requeued it (scancel: SIGTERM with no notice
    first; a preempted job is requeued, or still RUNNING in its grace time), unless its preemption is what ends it
    (PreemptMode=CANCEL); else 'preemption'."""
    if now is None or now.cancelled_by_preemption:
        return "preemption"
    left = None if now.end_time is None else now.end_time - time.time()
    if now.state in ("COMPLETING", "CANCELLED") and now.restarts == restarts_at_start:
        # Ending without a requeue: its time limit only once that has come (a job whose whole limit is shorter
        # than the margin, an evaluation job's 2 minutes, was requeued when cancelled).
        return "timeout" if left is not None and left <= LIMIT_REACHED_S else "cancelled"
    if left is not None and left <= timeout_margin_s:
        return "timeout"
    return "preemption"


class PreemptionGuard:
    WATCHES_START_UP = True  # whether the time to the first `should_stop()` is timed (as the start-up)

    def __init__(
        self, job_now: Callable[[], JobNow | None] = lambda: None, timeout_margin_s: float = 600.0, watch: bool = True
    ):
        """``job_now`` tells the job's state when asked (`hpctrain.runtime.job_now`; one rank asking is
        enough): a stop within ``timeout_margin_s`` of the time limit is a timeout, one of a job being
        cancelled a cancel, anything else a preemption. ``watch``: time the loop by the job's `[hang]`
        (hpctrain's trainer times its own phases)."""
        self.job_now, self.timeout_margin_s = job_now, timeout_margin_s
        self.signal: int | None = None
        self.received_at: float | None = None
        self.stopped = False  # the last `should_stop()`'s answer
        self._cause: str | None = None
        self.notice_file = notice_file()
        self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        self._read_notice()
        self.watchdog: RankWatchdog | None = None
        if watch:
            self.watchdog = RankWatchdog(job_hang_timeouts())
            if self.WATCHES_START_UP:
                self.watchdog.phase("start-up")

    def __enter__(self) -> PreemptionGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is None:
            self.signal, self.received_at = signum, time.time()

    def _read_notice(self) -> None:
        """Take a stop signal the batch shell wrote down (one a signal may never have brought here)."""
        if self.signal is not None or self.notice_file is None:
            return
        try:
            name, at = self.notice_file.read_text().strip(), self.notice_file.stat().st_mtime
        except OSError:  # none yet (the usual case)
            return
        self.signal, self.received_at = getattr(signal, f"SIG{name}", signal.SIGUSR2), at

    def should_stop(self) -> bool:
        """Collective when torch.distributed is initialised: True on every rank once any rank got a signal
        (``signal`` then holds the highest signal number any rank got)."""
        self._read_notice()
        self.signal = all_reduce_int(self.signal or 0, "max") or None
        if self.watchdog:  # the step after this call starts now
            self.watchdog.phase("step")
        self.stopped = self.signal is not None
        return self.stopped

    def cause(self) -> str:
        """'timeout', 'cancelled' or 'preemption' (see `stop_cause`), decided once a notice has come and Slurm has
        answered (rank 0 asks, its command shielded from a later copy of the notice: `stop_signals_ignored`)."""
        if self._cause is not None:
            return self._cause
        with stop_signals_ignored():
            now = self.job_now()
        cause = stop_cause(now, JobEnvironment().restart_count, self.timeout_margin_s)
        if self.signal is not None and now is not None:
            self._cause = cause
        return cause

    def reinstall(self) -> None:
        """Take the stop signals back from a framework that installed handlers of its own over this guard's."""
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)

    def end_watch(self) -> None:
        """The loop is over: what follows is not timed (the signals stay with the guard)."""
        if self.watchdog:
            self.watchdog.close()
            self.watchdog = None

    def finish(self) -> None:
        """The loop is over: end the watch; unless it stopped on a notice, rank 0 journals that this run's work is
        done (``finished``)."""
        self.end_watch()
        env = JobEnvironment()
        if not self.stopped and env.rank == 0 and (journal := Journal.from_env()) is not None:
            journal.write("finished", message="the training loop ran to its end")

    def uninstall(self) -> None:
        """Give the stop signals back and end the watch."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self.end_watch()
