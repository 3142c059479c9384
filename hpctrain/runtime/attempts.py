"""Attempts of a job or array task: what each run achieved, and whether another run is worth it.

One policy serves both sides: the batch script asks it when its step ends (``hpctrain attempt
end``), and `hpctrain reconcile` asks it for runs that died without a word (node failure,
a killed batch shell). Progress is measured in committed checkpoint steps, so a run preempted many
times keeps going while one that crashes at start stops after ``max_stalled_attempts``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.naming import MANIFEST, list_dirs, task_dir
from hpctrain.contract import JobEnvironment, JobPaths
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.schema import LOSES_WORK

# Not the job's doing: requeued whenever the spec allows requeue at all.
EXTERNAL = {"preemption", "timeout", "node_failure", "requeued"}
# The job's own doing: requeued only with retry.on_error.
OWN = {"error", "oom"}


@dataclass
class Outcome:
    """One run: why it ended (None while unknown), the newest committed checkpoint step before and after, and whether
    the trainer's own requeue on a notice failed, or was not seen to end (the batch script's `attempt end` then
    decides and requeues)."""

    cause: str | None
    step_start: int | None = None
    step_end: int | None = None
    requeue_failed: bool = False

    @property
    def stalled(self) -> bool:
        """No checkpoint progress. Without hpctrain checkpoints progress is unknown: then only the job's own
        failures count, so a user's script with checkpoints of its own survives any number of preemptions."""
        if self.step_start is None or self.step_end is None:
            return self.cause in OWN or self.cause == "refused"
        return self.step_end <= self.step_start


def rerun_of_completed(earlier: dict[int, Outcome]) -> str | None:
    """Why a run starting after the ``earlier`` runs of its task (by number) has nothing to do, or None: the last one
    completed the job's work after an earlier one was preempted. Slurm 24.11 still requeues such a job once more
    when it ends (sacct: PREEMPTED, PREEMPTED, COMPLETED): a run of Slurm's own, not of the job."""
    numbers = sorted(earlier)
    if len(numbers) < 2 or earlier[numbers[-1]].cause != "completed":
        return None
    if not any(earlier[n].cause in (None, "preemption", "requeued") for n in numbers[:-1]):
        return None
    return (
        f"run {numbers[-1]} completed the job after a preemption and Slurm started this run on its own "
        "(Slurm 24.11 requeues a preempted job once more when it ends)"
    )


def fill_end_steps(outcomes: list[Outcome], current_step: int | None) -> list[Outcome]:
    """A run that could not record its end step ended where the next one started (the last: ``current_step``)."""
    for i, o in enumerate(outcomes):
        if o.step_end is None:
            o.step_end = outcomes[i + 1].step_start if i + 1 < len(outcomes) else current_step
    return outcomes


def stalled_streak(outcomes: Iterable[Outcome]) -> int:
    """How many runs in a row, counting back from the last, stalled."""
    streak = 0
    for o in reversed(list(outcomes)):
        if not o.stalled:
            break
        streak += 1
    return streak


def decide(outcomes: list[Outcome], requeue: bool, on_error: bool, max_stalled: int) -> tuple[bool, str]:
    """(run again?, why) after the last of ``outcomes`` ended."""
    cause = outcomes[-1].cause or "unknown"
    if cause == "completed":
        return False, "completed"
    if cause == "cancelled":
        return False, "cancelled"
    if cause == "idle":
        return False, "idle: its GPUs stayed idle past [idle] cancel_minutes"
    if not requeue:
        return False, f"{cause}; requeue is off in the spec"
    if cause in OWN and not on_error:
        return False, f"{cause}; retry.on_error is off in the spec"
    streak = stalled_streak(outcomes)
    if streak >= max_stalled:
        return False, (
            f"requeue cap: {streak} consecutive attempts without checkpoint progress "
            f"(retry.max_stalled_attempts = {max_stalled}; last: {cause})"
        )
    return True, f"{cause}; requeued ({streak} of {max_stalled} attempts in a row without progress)"


def latest_committed_step(directory: Path | None) -> int | None:
    """The newest step with a manifest in ``directory`` (a directory listing, no verification); None without one."""
    if directory is None:
        return None
    steps = [d.step for d in list_dirs(directory) if (d.path / MANIFEST).is_file()]
    return max(steps, default=0)


@dataclass(frozen=True)
class RunPolicy:
    """A job spec's word on running again and where the task checkpoints, read from the spec as stored
    (the ledger's JSON, the job directory's spec.json) through the spec's own models: one set of defaults.
    Submit writes it into the job directory (policy.json), resolved: the batch script's `hpctrain attempt`, twice a
    run and once between SIGTERM and SIGKILL, reads it without importing them (0.06 CPU-s a call, not 0.18)."""

    requeue: bool
    on_error: bool
    max_stalled: int
    checkpoint_root: Path | None
    in_place: int = 0
    memory_tier: bool = False
    nodes: tuple[int, ...] = (1,)  # the job step's (spares apart): its shapes, preferred first
    spare_gpus: int = 0  # on the spare nodes
    exclude_node_after: int = 2
    tasks_per_node: int | None = None  # the spec's (None without one)

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> RunPolicy:
        from hpctrain.config.job import CheckpointPolicy, JobSpec, Resources, RetryPolicy

        retry = RetryPolicy.model_validate(spec.get("retry") or {})
        checkpoint = CheckpointPolicy.model_validate(spec.get("checkpoint") or {})
        resources = Resources.model_validate(spec.get("resources") or {})
        return cls(
            spec.get("requeue", JobSpec.model_fields["requeue"].default),
            retry.on_error,
            retry.max_stalled_attempts,
            checkpoint.dir,
            retry.in_place,
            bool(checkpoint.memory_every_steps),
            tuple(resources.node_counts),
            resources.spare_nodes * resources.gpus_per_node,
            retry.exclude_node_after,
            resources.ntasks_per_node if spec.get("resources") else None,
        )

    @classmethod
    def of_job(cls, env: JobEnvironment) -> RunPolicy:
        """The policy of the job ``env`` runs in: the policy.json beside its spec.json, else (a job submitted before
        hpctrain wrote one) its spec.json; the defaults without a spec."""
        if env.spec_file is None:
            return cls.of({})
        try:
            return cls.from_json(json.loads(JobPaths(env.spec_file.parent).policy_file.read_text(encoding="utf-8")))
        except FileNotFoundError:
            return cls.of(json.loads(env.spec_file.read_text(encoding="utf-8")))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        return {**data, "checkpoint_root": str(self.checkpoint_root) if self.checkpoint_root else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunPolicy:
        root = data["checkpoint_root"]
        return cls(**{**data, "checkpoint_root": Path(root) if root else None, "nodes": tuple(data["nodes"])})

    def decide(self, outcomes: list[Outcome]) -> tuple[bool, str]:
        return decide(outcomes, self.requeue, self.on_error, self.max_stalled)

    def checkpoint_dir(self, task_index: int) -> Path | None:
        """Where this task checkpoints, if the job does."""
        return task_dir(self.checkpoint_root, task_index) if self.checkpoint_root else None


def journal_outcomes(journal: Journal, task_index: int) -> dict[int, Outcome]:
    """This task's runs by number, from what its batch script (attempt_start/attempt_end), trainer (requeue, then
    requeued or requeue_failed; finished) and GPU sampler (idle_cancel: hpctrain.runtime.idle_cancel) journaled; a run
    that wrote nothing is missing. A trainer's requeue with no word of its end (killed half-way) counts as failed."""
    runs: dict[int, Outcome] = {}
    requeued: set[int] = set()
    kinds = ("attempt_start", "attempt_end", "requeue", "requeued", "requeue_failed", "finished", "idle_cancel")
    for _, rec in journal.records(kinds=kinds):
        if rec.get("task_index", -1) != task_index or rec.get("attempt") is None:
            continue
        run = runs.setdefault(rec["attempt"], Outcome(None))
        if rec["kind"] == "attempt_start":
            run.step_start = rec.get("step")
        elif rec["kind"] == "attempt_end":
            run.cause, run.step_end = rec.get("cause"), rec.get("step_end")
        elif run.cause is None and rec["kind"] == "finished":  # the trainer ran its last step
            run.cause = "completed"
        elif rec["kind"] == "idle_cancel":  # ended for its idle GPUs, whatever the batch script then saw
            run.cause = "idle"
        elif rec["kind"] == "requeue_failed":
            run.requeue_failed = True
        elif rec["kind"] == "requeued":
            requeued.add(rec["attempt"])
        elif run.cause is None:  # the trainer's checkpoint-and-requeue
            run.cause = rec.get("cause")
            run.step_end = rec.get("step") if rec.get("checkpointed") else None
            run.requeue_failed = True  # until its requeued
    for number in requeued & runs.keys():
        runs[number].requeue_failed = False
    return dict(sorted(runs.items()))


def loses_work(cause: str | None, checkpointed: bool = True) -> bool:
    """Whether a run that ended with ``cause`` lost the work since its newest checkpoint: a crash, a node failure,
    a hang, a kill without notice do; an announced preemption or the time limit do not when their notice saved a
    stop checkpoint (``checkpointed``)."""
    return cause in LOSES_WORK or (cause in ("preemption", "timeout") and not checkpointed)


@dataclass
class _Run:
    """A run as the interval's history sees it: when it started, its newest record, how it ended (if it said)."""

    start: float | None = None
    last: float = 0.0
    ended: bool = False
    lost: bool = False


# What a run's own records say of its end: the batch script's, the trainer's requeue on a notice, its last step.
_ENDS = ("attempt_end", "requeue", "finished")


def interruption_history(journal: Journal, task_index: int, in_place_only: bool = False) -> tuple[int, float]:
    """This task's interruptions that lost work so far, and the seconds its runs ran until then (to their end, else
    to their newest record: a step restarted in place, a checkpoint). They are the runs that ended so (unless
    ``in_place_only``; `loses_work`), a run that ended without a word before a later one started among them (killed
    with no notice), and every failed job step restarted in place (retry.in_place). A run that stopped on a notice
    and saved, as the trainer's requeue says, ran but lost nothing. The current run's time since its newest record
    is not in."""
    runs: dict[int, _Run] = {}
    events = 0
    for _, rec in journal.records(kinds=("attempt_start", "step_restart", *_ENDS)):
        if rec.get("task_index", -1) != task_index or rec.get("attempt") is None:
            continue
        run = runs.setdefault(rec["attempt"], _Run())
        run.last = max(run.last, rec["time"])
        if rec["kind"] == "attempt_start":
            run.start = rec["time"]
        elif rec["kind"] == "step_restart":
            events += 1
        elif not run.ended:
            run.ended = True
            run.lost = loses_work(rec.get("cause"), rec.get("checkpointed", True))
    silent = [n for n in sorted(runs)[:-1] if not runs[n].ended]
    if silent:  # their newest checkpoint is the last sign of their running
        for _, rec in journal.records(kinds=("checkpoint",)):
            if rec.get("task_index", -1) == task_index and rec.get("attempt") in silent:
                runs[rec["attempt"]].last = max(runs[rec["attempt"]].last, rec["time"])
    exposure = 0.0
    for number, run in runs.items():
        exposure += max(0.0, run.last - run.start) if run.start is not None else 0.0
        events += not in_place_only and (run.lost or number in silent)
    return events, exposure
