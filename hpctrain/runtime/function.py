"""Run one Python call submitted through `hpctrain.submit.executor.Executor` as a task of an hpctrain job.

    python -m hpctrain.runtime.function      (the job's command; every srun task runs it)

The call is submitit's own pickle (a `DelayedSubmission`) at `JobPaths.call(index)`, written
before sbatch (index: the array task's parameter index, else 0); its outcome goes where submitit's
`Job.result()` reads it, under submitit's names, so the login side is plain submitit.

What changes from submitit's own `process_job`, and why:
- Stop notices come through hpctrain's `PreemptionGuard` (USR2 forwarded by the batch script, SIGTERM,
  SIGHUP, and the notice file for a signal that came before this process). submitit checkpoints from
  the signal handler, wherever the call is, and then requeues with `scontrol requeue` itself. Here a
  call that asks `should_stop()` is only told, and stops at its step boundary with `requeue()`: its
  `checkpoint()` is then taken between two steps and nothing is recomputed. A call that never asks gets
  submitit's behaviour (rank 0 checkpoints at once).
- Rank 0 requeues once the checkpoint is saved, the way hpctrain's own trainer does
  (`requeue_after_stop`): journaled, so the ledger's attempts, the requeue cap and Slurm-version quirks
  apply as to every hpctrain job, instead of submitit's timeout countdown.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

from hpctrain.contract import JOB_DIR_ENV, JobEnvironment, JobPaths
from hpctrain.runtime.guard import PreemptionGuard


class Requeue(BaseException):
    """Raised by `requeue()` (and, for a call that never asks `should_stop()`, by the notice itself) to end
    the call so that it runs again. A BaseException: a call's ``except Exception`` must not swallow it."""


class CallGuard(PreemptionGuard):
    """hpctrain's guard for a submitted call: a notice ends the call at once on rank 0 (submitit's way)
    until the call asks `should_stop()`; from then on it only answers that question. A call that never asks is
    never timed: its first question starts the watch."""

    WATCHES_START_UP = False

    def __init__(self, rank: int):
        from hpctrain.runtime.guard import timeout_margin_s
        from hpctrain.runtime.requeue import rank0_probe

        self.rank, self.asked, self.running = rank, False, False
        # Rank 0 tells a time limit and a cancel from a preemption by the job's state: a cancelled call is not requeued
        super().__init__(job_now=rank0_probe(rank), timeout_margin_s=timeout_margin_s())

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        first = self.signal is None
        super()._handle(signum, frame)
        if first and self.running and not self.asked and self.rank == 0:
            self.running = False
            raise Requeue()

    def should_stop(self) -> bool:
        self.asked = True
        return super().should_stop()


_guard: CallGuard | None = None


def should_stop() -> bool:
    """True on every rank once a preemption or time-limit notice reached any rank (collective under
    torch.distributed: call it at the same step on every rank). False outside a submitted call, so the
    same function runs anywhere."""
    return _guard is not None and _guard.should_stop()


def requeue() -> None:
    """End this call here and run it again: from its ``checkpoint()`` (a `submitit.helpers.Checkpointable`),
    taken now, between two steps; else from the start, the call resuming from what it saved itself."""
    raise Requeue()


def _save(outcome: str, value: Any, path: Path) -> None:
    from submitit.core import utils

    with utils.temporary_save_path(path) as tmp:
        utils.cloudpickle_dump((outcome, value), tmp)


def _checkpoint(delayed: Any, path: Path) -> str:
    """Replace the call's pickle with its checkpoint (atomically); what was done, for the log."""
    from submitit.core import utils

    again = delayed._checkpoint_function()
    if again is None:
        return "not checkpointable: it runs again from its start"
    with utils.temporary_save_path(path) as tmp:
        again.dump(tmp)
    return f"checkpointed into {path.name}"


def run(job: JobEnvironment) -> int:
    """Run this task's call; its exit status. The result (or the traceback) is written for every rank under
    submitit's name for it; a requeued call writes nothing and exits 0 (rank 0 has requeued the job)."""
    global _guard
    from submitit import JobEnvironment as SubmititEnvironment
    from submitit.core.utils import DelayedSubmission

    if job.job_dir is None:
        print(f"hpctrain: not an hpctrain job: {JOB_DIR_ENV} is not set", file=sys.stderr)
        return 2
    # submitit's own environment, for the call (`submitit.JobEnvironment()`) and for where results go.
    os.environ["SUBMITIT_EXECUTOR"], os.environ["SUBMITIT_FOLDER"] = "slurm", str(job.job_dir)
    env = SubmititEnvironment()
    path = JobPaths(job.job_dir).call(job.param_index)
    result_path = env.paths.result_pickle
    _guard = guard = CallGuard(env.global_rank)
    try:
        delayed = DelayedSubmission.load(path)
        if guard.signal is not None:  # the notice came before this process: run again without starting
            raise Requeue()
        guard.running = True
        result = delayed.result()
        guard.running = False
        _save("success", result, result_path)
        guard.finish()
        return 0
    except Requeue:
        guard.running = False
        if guard.signal is None:
            _save("error", "requeue() was called without a stop notice (see should_stop())", result_path)
            return 1
        if env.global_rank != 0:
            return 0
        saved = _checkpoint(delayed, path)  # first: the cause is decided after it, a cancel may come meanwhile
        message = f"{guard.cause()}: call stopped on the notice; {saved}"
        print(f"hpctrain: {message}", file=sys.stderr, flush=True)
        from hpctrain.runtime.requeue import requeue_after_stop

        requeue_after_stop(guard, message)
        return 0
    except Exception:
        guard.running = False
        _save("error", traceback.format_exc(), result_path)
        raise
    finally:
        guard.uninstall()
        _guard = None


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy: the call's should_stop() and Requeue are its.
    from hpctrain.runtime import function

    sys.exit(function.run(JobEnvironment()))
