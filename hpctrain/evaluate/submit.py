"""`hpctrain eval` on the login node: which committed checkpoints of a job to evaluate, with which evaluators,
and one evaluation job for each that was not asked for before (the ledger's `evaluations` keep each
(job, task, step, evaluator) once; a failed or expired one may be asked again).

An evaluation job is the training job's spec made small: the same environment, setup lines, container, working
directory (its paths as they were resolved then), model and `[eval]` data, one task on one GPU (`gpus`), the
site's preemptible QOS by default (an evaluation can wait, and a preempted one is requeued and runs again from the
start), `[eval] time` at most, running ``python -m hpctrain.evaluate`` on the checkpoint.

A submission holds a lock beside the ledger: it commits the request (requested, with the unique Slurm job name it is
submitted under) before its sbatch, links the ledger job in the transaction that records it, and marks it
submitted once Slurm took it. So a request still requested under the lock is one whose submitter died: `settle`
finds its job in Slurm by that name (submitted) or knows it never got there (expired: asked again), and a
refused submission is that request's failure alone.
"""

from __future__ import annotations

import contextlib
import json
import secrets
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.config import SiteConfig
from hpctrain.config.job import EVAL_TIME_S, JobSpec, recorded_job_spec
from hpctrain.config.types import format_slurm_time
from hpctrain.errors import HpctrainError, SlurmTimeout
from hpctrain.evaluate.run import BUILT_IN, Target
from hpctrain.files import exclusive_lock
from hpctrain.ledger import Ledger
from hpctrain.ledger.evaluations import ASK_AGAIN, EXPIRED, FAILED, OPEN, REQUESTED, SUBMITTED
from hpctrain.ledger.rows import EvaluationRow, JobRow
from hpctrain.slurm.client import SlurmClient

LOCK_WAIT_S = 300.0  # another submission holds the lock: an sbatch (60 s at most) and the ledger writes


@dataclass(frozen=True)
class Requested:
    """One evaluation asked for: its target, its evaluator and the ledger id of its job (None: asked for before,
    and ``before`` is that request's state)."""

    target: Target
    evaluator: str
    eval_job_id: int | None
    before: str | None = None


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


def eval_job_spec(
    job: JobRow, target: Target, evaluator: str, command: list[str] | None, gpus: int, token: str = "0"
) -> JobSpec:
    """The evaluation job of ``target`` (see the module's docstring), named after the job and ``token``: the name
    its request finds it by in Slurm."""
    data: dict[str, Any] = json.loads(job["spec_json"] or "{}")
    for var in data.get("env", {}).values():
        if var.get("secret"):
            var["value"] = None  # taken from the submitting environment again, never from the ledger's "<secret>"
    p = data.get("parallel", {})
    resources = data.get("resources", {})
    data.update(
        name=f"{data['name'][:44]}-eval-{token}",
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
            "time": data.get("eval", {}).get("time", format_slurm_time(EVAL_TIME_S)),
            "preemptible": True,
        },
        checkpoint={},
    )
    for key in ("array", "dependency", "retry", "hang"):
        data.pop(key, None)
    return recorded_job_spec(data, f"the evaluation job of ledger job {job['id']}")


def request(
    ledger: Ledger,
    site: SiteConfig,
    job_id: int,
    steps: Iterable[int] | None,
    every: bool,
    names: Iterable[str],
    gpus: int = 1,
    task: int | None = None,
    retry: bool = False,
) -> list[Requested]:
    """Submit an evaluation job for each (checkpoint, evaluator) not asked for before (of one ``task``, if given);
    with ``retry``, the failed ones again too (and without ``steps`` or ``every``: every failed one of the job)."""
    job = ledger.jobs.get(job_id)
    if job is None:
        raise HpctrainError(f"job {job_id}: no such ledger id (see `hpctrain status --all`)")
    chosen = evaluators(job_spec(job), names)
    client = SlurmClient.for_site(site)
    recover(ledger, client)
    if retry and steps is None and not every:
        failed = {
            (e["task_index"], e["step"], e["evaluator"])
            for e in ledger.evaluations.of_job(job_id)
            if e["state"] in ASK_AGAIN
        }
        every_one = targets(ledger, job, None, True, task)
        pairs = [(t, n) for t in every_one for n in chosen if (t.task_index, t.step, n) in failed]
        if not pairs:
            raise HpctrainError(
                f"job {job_id}: no failed or expired evaluation to ask again (see `hpctrain show {job_id}`)"
            )
    else:
        pairs = [(t, n) for t in targets(ledger, job, steps, every, task) for n in chosen]
    ask_again = ASK_AGAIN if retry else (EXPIRED,)
    return [submit_one(ledger, site, job, t, n, chosen[n], gpus, client, ask_again) for t, n in pairs]


def follow(ledger: Ledger, site: SiteConfig, job_id: int, always: bool = False) -> Iterator[Requested]:
    """For a job whose spec says `[eval] on_checkpoint` (or ``always``): evaluation jobs for its committed checkpoints not
    asked for yet (or whose request expired), newest first, with every evaluator, while fewer than `max_pending` of
    its evaluation jobs are in flight (with `skip_superseded`, none for a checkpoint older than the newest one asked
    for). A submission that fails raises, after the ones before it."""
    from hpctrain.slurm.states import TERMINAL

    job = ledger.jobs.known(job_id)
    spec = job_spec(job)
    if not (spec.eval.on_checkpoint or always) or not any(
        c["state"] == "committed" for c in ledger.checkpoints.of_job(job["id"])
    ):
        return
    asked = [e for e in ledger.evaluations.of_job(job["id"]) if e["state"] != EXPIRED]
    running = [e["eval_job_id"] for e in asked if e["state"] in OPEN and e["eval_job_id"] is not None]
    in_flight = sum(ledger.jobs.known(i)["state"] not in TERMINAL for i in running)
    seen = {(e["task_index"], e["step"], e["evaluator"]) for e in asked}
    newest: dict[tuple[int, str], int] = {}
    for e in asked:
        newest[(e["task_index"], e["evaluator"])] = max(e["step"], newest.get((e["task_index"], e["evaluator"]), -1))
    chosen = evaluators(spec, [])
    client = SlurmClient.for_site(site)
    for target in sorted(targets(ledger, job, None, True), key=lambda t: -t.step):
        for name, command in chosen.items():
            key = (target.task_index, name)
            if (target.task_index, target.step, name) in seen:
                continue
            if spec.eval.skip_superseded and target.step < newest.get(key, -1):
                continue
            if in_flight >= spec.eval.max_pending:
                return
            yield submit_one(ledger, site, job, target, name, command, 1, client)
            in_flight, newest[key] = in_flight + 1, max(target.step, newest.get(key, -1))


def unasked(ledger: Ledger, job_id: int) -> int:
    """How many (committed checkpoint, evaluator) pairs of the job were not asked for yet (or expired)."""
    job = ledger.jobs.known(job_id)
    committed = [c for c in ledger.checkpoints.of_job(job_id) if c["state"] == "committed"]
    if not committed:
        return 0
    seen = {
        (e["task_index"], e["step"], e["evaluator"]) for e in ledger.evaluations.of_job(job_id) if e["state"] != EXPIRED
    }
    names = evaluators(job_spec(job), [])
    return sum((c["task_index"], c["step"], n) not in seen for c in committed for n in names)


def follow_all(ledger: Ledger, site: SiteConfig, ended_since: float) -> tuple[list[Requested], list[str]]:
    """`follow` every job of the site that is active or ended since ``ended_since``, after settling the requests
    whose submitter died: what was submitted, and one line for each job whose submission failed (the others go on)."""
    from hpctrain.slurm.states import TERMINAL

    recover(ledger, SlurmClient.for_site(site))
    following = ledger.jobs.following_checkpoints(site.name, TERMINAL, ended_since)
    submitted: list[Requested] = []
    failures: list[str] = []
    for job_id in dict.fromkeys(following):
        try:
            submitted.extend(follow(ledger, site, job_id))
        except HpctrainError as exc:
            failures.append(f"job {job_id}: {one_line(exc)}")
    return submitted, failures


@contextlib.contextmanager
def submission_lock(ledger: Ledger) -> Iterator[None]:
    """The lock every evaluation submission holds, beside the ledger (on any login node): a request requested
    while it is held is one whose submitter died."""
    path = ledger.path.with_name(ledger.path.name + ".eval-lock")
    try:
        with exclusive_lock(path, LOCK_WAIT_S):
            yield
    except TimeoutError:
        raise HpctrainError(
            f"{path}: another evaluation submission has held the lock for over {LOCK_WAIT_S:g}s"
        ) from None


def recover(ledger: Ledger, client: SlurmClient) -> None:
    """Settle every request whose submitter died between its commit and its outcome (see `settle`)."""
    if not ledger.evaluations.undecided():  # the usual case: no lock taken
        return
    with submission_lock(ledger):
        for row in ledger.evaluations.undecided():
            settle(ledger, client, row)


def settle(ledger: Ledger, client: SlurmClient, row: EvaluationRow, refused: str | None = None) -> str:
    """Decide a request still requested, under the submission lock: submitted where Slurm has its job (found by
    its name when the ledger lacks its id), else failed (``refused``: why its submission was refused) or expired
    (its submitter died before Slurm took it). A Slurm that cannot say leaves it requested (SlurmError)."""
    key = (row["job_id"], row["task_index"], row["step"], row["evaluator"])
    eval_job = ledger.jobs.get(row["eval_job_id"]) if row["eval_job_id"] is not None else None
    if eval_job is not None:  # recorded, so its sbatch may have happened
        slurm_id = eval_job["slurm_job_id"] or client.find_by_name(row["submission_key"] or "", row["requested_at"])
        if slurm_id is not None:
            if not eval_job["slurm_job_id"]:
                ledger.jobs.submitted(eval_job["id"], slurm_id, at=eval_job["updated_at"])
            ledger.evaluations.submitted(*key, eval_job["id"])
            return SUBMITTED
        if eval_job["state"] == "SUBMITTING":
            ledger.jobs.submit_failed(eval_job["id"], "its submitter was killed before Slurm took it")
    state = FAILED if refused is not None else EXPIRED
    ledger.evaluations.unsubmitted(*key, state, refused or "its submitter was killed before Slurm took its job")
    return state


def one_line(exc: BaseException) -> str:
    return "; ".join(str(exc).splitlines())


def submit_one(
    ledger: Ledger,
    site: SiteConfig,
    job: JobRow,
    target: Target,
    name: str,
    command: list[str] | None,
    gpus: int,
    client: SlurmClient | None = None,
    again: Collection[str] = (EXPIRED,),
) -> Requested:
    """The evaluation job of (``target``, ``name``), unless it was asked for before (``eval_job_id`` None then; a
    request in a state of ``again`` is asked again)."""
    from hpctrain.submit import Submitter

    client = client or SlurmClient.for_site(site)
    key = (target.job_id, target.task_index, target.step, name)
    where = f"step {target.step} ({name})"
    spec = eval_job_spec(job, target, name, command, gpus, secrets.token_hex(6))  # bad input: refused, nothing kept
    with submission_lock(ledger):
        row = ledger.evaluations.get(*key)
        if row is not None and row["state"] == REQUESTED:  # its submitter died
            settle(ledger, client, row)
        if not ledger.evaluations.request(*key, str(target.checkpoint), spec.name, again):
            before = ledger.evaluations.get(*key)
            return Requested(target, name, None, before["state"] if before else None)

        def link(eval_job: int, _chunk: object) -> None:
            ledger.evaluations.linked(*key, eval_job)

        try:
            submitted = Submitter(site, ledger, client).submit(spec, where, on_record=link)
        except HpctrainError as exc:
            row = ledger.evaluations.get(*key)
            if row is not None and not isinstance(exc, SlurmTimeout):  # a timeout: the next run finds it, or not
                if settle(ledger, client, row, refused=one_line(exc)) == SUBMITTED:
                    return Requested(target, name, row["eval_job_id"])
            raise
        ledger.evaluations.submitted(*key, submitted.ledger_ids[0])
    return Requested(target, name, submitted.ledger_ids[0])


def job_spec(job: JobRow) -> JobSpec:
    """The spec the ledger recorded for ``job``."""
    return recorded_job_spec(json.loads(job["spec_json"] or "{}"), f"the spec of ledger job {job['id']}")
