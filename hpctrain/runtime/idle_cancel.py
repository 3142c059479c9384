"""Ending a run whose every GPU stayed idle (`[idle] action = "cancel"`): decided once across the job step's nodes,
journaled before Slurm is asked.

Each node's sampler (hpctrain.runtime.utilization) marks its node in the job's idle folder while every GPU it reads
is idle, with the moment they all were, and removes the mark when one works. A sampler that finds every node of the
step marked, the newest mark older than ``cancel_minutes``, makes the run's decision file, exclusively: one run, one
decision, however many nodes find it at once. The decision is journaled (``idle_cancel``: the run's end, cause
``idle``, never requeued, hpctrain.runtime.attempts) and then the job, or its array task, is cancelled. A sampler
killed between the two leaves the decision: the next one to find it, RESEND_S later, journals what is missing and
cancels again (cancelling a job that is ending already is harmless).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from pathlib import Path

from hpctrain.contract import JobEnvironment, JobPaths
from hpctrain.files import write_atomic
from hpctrain.ledger.journal import Journal

RESEND_S = 30.0  # a decision not yet seen through is cancelled again this long after its last try
KIND = "idle_cancel"


def _slurm_cancel(target: str) -> None:
    from hpctrain.slurm.client import CANCEL_ENDED, SlurmClient

    SlurmClient().scancel([target], harmless=CANCEL_ENDED)


class IdleCancel:
    """One node's part in ending its run for idle GPUs; ``check`` after each reading of the node's GPUs."""

    def __init__(
        self,
        env: JobEnvironment,
        grace_s: float,
        rule: str,
        journal: Journal,
        cancel: Callable[[str], object] = _slurm_cancel,
    ):
        assert env.job_dir is not None
        self.folder = JobPaths(env.job_dir).idle_dir
        self.run = (f"task{env.task_index}-" if env.task_index >= 0 else "") + f"run{env.run_number}"
        self.attempt, self.task_index = env.run_number, env.task_index
        step = f"{self.run}.{env.step_restarts}-node-"
        self.pattern = f"{glob.escape(step)}*"
        self.mark = self.folder / f"{step}{env.node}"
        self.decision = self.folder / f"{self.run}-ended"
        self.nodes, self.grace_s, self.rule, self.journal = env.step_node_count, grace_s, rule, journal
        self.target, self.cancel = env.requeue_target, cancel
        self._since: float | None = None  # when this node's GPUs were all idle, as its mark says

    def check(self, idle_for_s: float, at: float) -> bool:
        """After a reading in which every GPU of this node has been idle ``idle_for_s`` seconds (0: one works):
        mark or unmark the node, and end the run once every node is idle past the grace. Whether it is ended."""
        if idle_for_s <= 0:
            if self._since is not None:
                self.mark.unlink(missing_ok=True)
                self._since = None
            return False
        if self._since is None:
            self._since = at - idle_for_s
            self.folder.mkdir(exist_ok=True)
            write_atomic(self.mark, repr(self._since))
        newest = self._newest_mark()
        if newest is None or at - newest < self.grace_s:
            return False
        self._end(at, at - newest)
        return True

    def _newest_mark(self) -> float | None:
        """The latest moment a node of the step became idle; None until every node is."""
        marks = [Path(p) for p in glob.glob(str(self.folder / self.pattern))]
        if len(marks) < self.nodes:
            return None
        try:
            return max(float(p.read_text(encoding="utf-8")) for p in marks)
        except (OSError, ValueError):  # a mark removed meanwhile (its node worked): not every node is idle
            return None

    def _end(self, at: float, idle_s: float) -> None:
        try:
            fd = os.open(self.decision, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if at - self.decision.stat().st_mtime < RESEND_S:
                return  # decided and acted on a moment ago, here or on another node
            os.utime(self.decision)
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(f"{at}\n")
        if not self._journaled():
            self.journal.write(
                KIND,
                attempt=self.attempt,
                task_index=self.task_index,
                cause="idle",
                requeued=False,
                idle_s=round(idle_s, 1),
                grace_s=self.grace_s,
                nodes=self.nodes,
                message=(
                    f"every GPU of the job idle for {idle_s / 60:.1f} min ({self.rule}): "
                    "the job is cancelled, not requeued"
                ),
            )
        self.cancel(self.target)

    def _journaled(self) -> bool:
        """Whether this run's decision is in the journal already (a sampler killed before it cancelled)."""
        return any(
            rec.get("attempt") == self.attempt and rec.get("task_index", -1) == self.task_index
            for _, rec in self.journal.records(kinds=(KIND,))
        )
