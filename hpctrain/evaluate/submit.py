"""`hpctrain eval` on the login node: which committed checkpoints of a job to evaluate, with which evaluators,
and one evaluation job for each that was not asked for before (the ledger's `evaluations` keep each
(job, task, step, evaluator) once).

An evaluation job is the training job's spec made small: the same environment, setup lines, container, working
directory, model and `[eval]` data, one task on one GPU (`gpus`), the site's preemptible QOS by default (an
evaluation can wait, and a preempted one is requeued and runs again from the start), running
``python -m hpctrain.evaluate`` on the checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config import SiteConfig
from hpctrain.config.job import JobSpec
from hpctrain.config.loading import validate
from hpctrain.errors import HpctrainError
from hpctrain.evaluate.run import BUILT_IN, Target
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import JobRow

EVAL_TIME = "00:30:00"


@dataclass(frozen=True)
class Requested:
    """One evaluation asked for: its target, its evaluator and the ledger id of its job (None: asked for before)."""

    target: Target
    evaluator: str
    eval_job_id: int | None


def targets(ledger: Ledger, job: JobRow, steps: Iterable[int] | None, every: bool) -> list[Target]:
    """The job's committed checkpoints at ``steps``, all of them (``every``), or the newest of each task."""
    committed = [c for c in ledger.checkpoints.of_job(job["id"]) if c["state"] == "committed"]
    if not committed:
        raise HpctrainError(
            f"job {job['id']}: no committed checkpoint in the ledger yet (`hpctrain reconcile` reads them)"
        )
    found = [Target(job["id"], c["task_index"], c["step"], Path(c["path"])) for c in committed]
    if every:
        return found
    if steps is None:
        newest: dict[int, Target] = {}
        for t in found:
            if t.task_index not in newest or t.step > newest[t.task_index].step:
                newest[t.task_index] = t
        return list(newest.values())
    wanted = list(steps)
    missing = sorted(set(wanted) - {t.step for t in found})
    if missing:
        have = ", ".join(str(s) for s in sorted({t.step for t in found}))
        raise HpctrainError(f"job {job['id']}: no committed checkpoint at step {missing[0]} (committed: {have})")
    return [t for t in found if t.step in wanted]


def evaluators(spec: JobSpec, names: Iterable[str]) -> dict[str, list[str] | None]:
    """The evaluators ``names`` (default: heldout where the spec has held-out data and a model, and every one of
    the spec's own) -> their command (None: the built-in one)."""
    own: dict[str, list[str] | None] = dict(spec.eval.evaluators)
    builtin = spec.model is not None and spec.eval.enabled
    available = ({BUILT_IN: None} if builtin else {}) | own
    wanted = list(names) or list(available)
    if not wanted:
        raise HpctrainError(
            f"{spec.name}: nothing to evaluate with: give the spec held-out data ([eval] index or holdout) for the "
            "heldout evaluator, or evaluators of its own ([eval] evaluators)"
        )
    for name in wanted:
        if name not in available:
            raise HpctrainError(f"{spec.name}: no evaluator {name!r} (it has: {', '.join(available) or 'none'})")
    return {name: available[name] for name in wanted}


def eval_job_spec(job: JobRow, target: Target, evaluator: str, command: list[str] | None, gpus: int) -> JobSpec:
    """The evaluation job of ``target`` (see the module's docstring)."""
    data: dict[str, Any] = json.loads(job["spec_json"] or "{}")
    for var in data.get("env", {}).values():
        if var.get("secret"):
            var["value"] = None  # taken from the submitting environment again, never from the ledger's "<secret>"
    p = data.get("parallel", {})
    resources = data.get("resources", {})
    data.update(
        name=f"{data['name']}-eval"[:64],
        command=[
            "python",
            "-m",
            "hpctrain.evaluate",
            "--of",
            str(target.job_id),
            "--task",
            str(target.task_index),
            "--step",
            str(target.step),
            "--checkpoint",
            str(target.checkpoint),
            "--evaluator",
            evaluator,
            *(["--", *command] if command else []),
        ],
        launcher="none",
        # One process: the same samples as the loop's (global batch kept), one task.
        parallel={"micro_batch": p.get("micro_batch", 1), "grad_accum": p.get("grad_accum", 1) * p.get("dp", 1)},
        resources={
            **{k: resources[k] for k in ("account", "partition", "mem", "cpus_per_task") if k in resources},
            "nodes": 1,
            "gpus_per_node": gpus,
            "tasks_per_node": 1,
            "time": EVAL_TIME,
            "preemptible": True,
        },
        checkpoint={},
    )
    for key in ("array", "dependency", "retry", "hang"):
        data.pop(key, None)
    return validate(JobSpec, data, f"the evaluation job of ledger job {job['id']}")


def request(
    ledger: Ledger,
    site: SiteConfig,
    job_id: int,
    steps: Iterable[int] | None,
    every: bool,
    names: Iterable[str],
    gpus: int = 1,
) -> list[Requested]:
    """Submit an evaluation job for each (checkpoint, evaluator) not asked for before."""
    from hpctrain.submit import Submitter

    job = ledger.jobs.get(job_id)
    if job is None:
        raise HpctrainError(f"job {job_id}: no such ledger id (see `hpctrain status --all`)")
    spec = JobSpec.model_validate(json.loads(job["spec_json"] or "{}"))
    chosen = evaluators(spec, names)
    out = []
    for target in targets(ledger, job, steps, every):
        for name, command in chosen.items():
            key = (target.job_id, target.task_index, target.step, name)
            if not ledger.evaluations.request(*key, str(target.checkpoint)):
                out.append(Requested(target, name, None))
                continue
            try:
                submitted = Submitter(site, ledger).submit(eval_job_spec(job, target, name, command, gpus), "<eval>")
            except BaseException:
                ledger.evaluations.withdraw(*key)
                raise
            ledger.evaluations.submitted(*key, submitted.ledger_ids[0])
            out.append(Requested(target, name, submitted.ledger_ids[0]))
    return out
