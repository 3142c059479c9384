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


def targets(
    ledger: Ledger, job: JobRow, steps: Iterable[int] | None, every: bool, task: int | None = None
) -> list[Target]:
    """The job's committed checkpoints (of one ``task``) at ``steps``, all of them (``every``), or the newest of
    each task."""
    committed = [
        c for c in ledger.checkpoints.of_job(job["id"]) if c["state"] == "committed" and task in (None, c["task_index"])
    ]
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


def checkpoint_of(ledger: Ledger, path: Path) -> tuple[int, int, int]:
    """(ledger job id, task, step) of the committed checkpoint at ``path``, as its job journaled it."""
    for candidate in dict.fromkeys((str(path), str(path.absolute()), str(path.resolve()))):
        row = ledger.checkpoints.at(candidate)
        if row is not None and row["job_id"] is not None:
            if row["state"] != "committed":
                raise HpctrainError(f"{path}: checkpoint of job {row['job_id']} step {row['step']} is {row['state']}")
            return row["job_id"], row["task_index"], row["step"]
    raise HpctrainError(
        f"{path}: no job in the ledger wrote this checkpoint (`hpctrain reconcile` reads what jobs wrote); "
        "run an evaluator on it by hand: python -m hpctrain.evaluate --help"
    )


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
            f"--checkpoint={target.checkpoint}",  # one word: a relative path may start with '-'
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
    task: int | None = None,
) -> list[Requested]:
    """Submit an evaluation job for each (checkpoint, evaluator) not asked for before (of one ``task``, if given)."""
    job = ledger.jobs.get(job_id)
    if job is None:
        raise HpctrainError(f"job {job_id}: no such ledger id (see `hpctrain status --all`)")
    chosen = evaluators(job_spec(job), names)
    return [
        submit_one(ledger, site, job, target, name, command, gpus)
        for target in targets(ledger, job, steps, every, task)
        for name, command in chosen.items()
    ]


def follow(ledger: Ledger, site: SiteConfig, job_id: int, always: bool = False) -> list[Requested]:
    """For a job whose spec says `[eval] on_checkpoint` (or ``always``): evaluation jobs for its committed checkpoints not asked
    for yet, newest first, with every evaluator, while fewer than `max_pending` of its evaluation jobs are in
    flight (with `skip_superseded`, none for a checkpoint older than the newest one asked for)."""
    from hpctrain.ledger.evaluations import REQUESTED
    from hpctrain.slurm.states import TERMINAL

    job = ledger.jobs.known(job_id)
    spec = job_spec(job)
    if not (spec.eval.on_checkpoint or always) or not any(
        c["state"] == "committed" for c in ledger.checkpoints.of_job(job["id"])
    ):
        return []
    asked = ledger.evaluations.of_job(job["id"])
    running = [e["eval_job_id"] for e in asked if e["state"] == REQUESTED and e["eval_job_id"] is not None]
    in_flight = sum(ledger.jobs.known(i)["state"] not in TERMINAL for i in running)
    seen = {(e["task_index"], e["step"], e["evaluator"]) for e in asked}
    newest: dict[tuple[int, str], int] = {}
    for e in asked:
        newest[(e["task_index"], e["evaluator"])] = max(e["step"], newest.get((e["task_index"], e["evaluator"]), -1))
    chosen = evaluators(spec, [])
    out: list[Requested] = []
    for target in sorted(targets(ledger, job, None, True), key=lambda t: -t.step):
        for name, command in chosen.items():
            key = (target.task_index, name)
            if (target.task_index, target.step, name) in seen:
                continue
            if spec.eval.skip_superseded and target.step < newest.get(key, -1):
                continue
            if in_flight >= spec.eval.max_pending:
                return out
            out.append(submit_one(ledger, site, job, target, name, command, 1))
            in_flight, newest[key] = in_flight + 1, max(target.step, newest.get(key, -1))
    return out


def unasked(ledger: Ledger, job_id: int) -> int:
    """How many (committed checkpoint, evaluator) pairs of the job were not asked for yet."""
    job = ledger.jobs.known(job_id)
    committed = [c for c in ledger.checkpoints.of_job(job_id) if c["state"] == "committed"]
    if not committed:
        return 0
    seen = {(e["task_index"], e["step"], e["evaluator"]) for e in ledger.evaluations.of_job(job_id)}
    names = evaluators(job_spec(job), [])
    return sum((c["task_index"], c["step"], n) not in seen for c in committed for n in names)


def follow_all(ledger: Ledger, site: SiteConfig, ended_since: float) -> list[Requested]:
    """`follow` every job of the site that is active or ended since ``ended_since``."""
    from hpctrain.slurm.states import TERMINAL

    jobs = [*ledger.jobs.active(site.name, TERMINAL), *ledger.jobs.ended_since(site.name, ended_since)]
    # A look at the JSON first: a busy user's thousands of active jobs are not validated as specs each time.
    following = [job["id"] for job in jobs if json.loads(job["spec_json"] or "{}").get("eval", {}).get("on_checkpoint")]
    return [r for job_id in following for r in follow(ledger, site, job_id)]


def submit_one(
    ledger: Ledger, site: SiteConfig, job: JobRow, target: Target, name: str, command: list[str] | None, gpus: int
) -> Requested:
    """The evaluation job of (``target``, ``name``), unless it was asked for before (``eval_job_id`` None then)."""
    from hpctrain.submit import Submitter

    key = (target.job_id, target.task_index, target.step, name)
    if not ledger.evaluations.request(*key, str(target.checkpoint)):
        return Requested(target, name, None)
    try:
        submitted = Submitter(site, ledger).submit(eval_job_spec(job, target, name, command, gpus), "<eval>")
    except BaseException:
        ledger.evaluations.withdraw(*key)
        raise
    ledger.evaluations.submitted(*key, submitted.ledger_ids[0])
    return Requested(target, name, submitted.ledger_ids[0])


def job_spec(job: JobRow) -> JobSpec:
    """The spec the ledger recorded for ``job``."""
    return JobSpec.model_validate(json.loads(job["spec_json"] or "{}"))
