"""Fold journal records written by compute nodes into the ledger, each exactly once."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.contract import UTILIZATION
from hpctrain.ledger.db import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.rows import AttemptFields, NewCheckpoint, SegmentKey

# A handler folds a record in; one that returns False leaves it unread: not noted, a later read reads it again.
Handler = Callable[[Ledger, dict[str, Any]], "bool | None"]

_CONTEXT = ("kind", "time", "job_id", "slurm_job_id", "task_index", "restart", "host", "rank")
BATCH = 200  # records per write transaction: few lock round trips, and no writer waits long behind one


def _checkpoint(ledger: Ledger, rec: dict[str, Any]) -> None:
    ledger.checkpoints.record(
        NewCheckpoint(
            job_id=rec.get("job_id"),
            task_index=rec.get("task_index", -1),
            step=rec.get("step"),
            path=rec["path"],
            state=rec.get("state"),
            created_at=rec["time"],
            bytes=rec.get("bytes"),
            duration_s=rec.get("duration_s"),
            manifest_sha256=rec.get("manifest_sha256"),
            metric_name=rec.get("metric_name"),
            metric_value=rec.get("metric_value"),
            note=rec.get("note"),
        )
    )


def _segment(rec: dict[str, Any]) -> SegmentKey | None:
    """The job step start a trainer's record belongs to (None outside Slurm: no run number)."""
    if rec.get("job_id") is None or rec.get("attempt") is None:
        return None
    return {
        "job_id": rec["job_id"],
        "task_index": rec.get("task_index", -1),
        "attempt": rec["attempt"],
        "step_restart": rec.get("step_restart") or 0,
    }


def _startup(ledger: Ledger, rec: dict[str, Any]) -> None:
    if key := _segment(rec):
        times = rec.get("times") or {}
        ledger.segments.started(
            key,
            main_at=times.get("main"),
            loaded_at=times.get("loaded"),
            resumed_from=rec.get("resumed_from") or 0,
            tier=rec.get("tier"),
        )
    _event(ledger, rec)


def _hang(ledger: Ledger, rec: dict[str, Any]) -> None:
    if key := _segment(rec):
        ledger.segments.hung(key)
    _event(ledger, rec)


def _utilization(ledger: Ledger, rec: dict[str, Any]) -> bool:
    """A node sampler's record (hpctrain.runtime.utilization): not an event (one a minute per node). A settled job's
    are packed already: left unread (False), so that the job, reopened, reads them again."""
    if not (key := _segment(rec)):
        return True
    if ledger.usage.settled(key["job_id"]):
        return False
    timeline = [tuple(point) for point in rec.get("timeline") or []]
    ledger.gpus.record(
        key, rec["host"], rec["source"], rec["gpus"], rec["policy"], timeline, rec["time"], bool(rec.get("final"))
    )
    return True


def _metrics(ledger: Ledger, rec: dict[str, Any]) -> None:
    if rec.get("job_id") is None:
        raise ValueError("metrics record without a ledger job id")
    if (key := _segment(rec)) and "step_time_s" in rec["values"]:
        ledger.segments.stepped(key, step=rec["step"], seconds=rec["values"]["step_time_s"], time=rec["time"])
    ledger.metrics.record(
        rec["job_id"], rec.get("task_index", -1), rec["step"], rec["values"], rec.get("restart", 0), rec["time"]
    )


def _event(ledger: Ledger, rec: dict[str, Any]) -> None:
    data = {k: v for k, v in rec.items() if k not in _CONTEXT and k != "message"}
    data.update(host=rec.get("host"), rank=rec.get("rank"), slurm_job_id=rec.get("slurm_job_id"))
    ledger.events.add(rec["kind"], rec.get("message", ""), rec.get("job_id"), data, at=rec["time"])


def _attempt_fields(rec: dict[str, Any]) -> AttemptFields:
    """What a batch-script (attempt_*) or trainer (requeue, requeued, requeue_failed) record says about its run. A
    requeue that its writer does itself after the record (the trainer's ``requeue``, an ``attempt_end`` whose
    ``requeue_follows``) decides nothing until its ``requeued`` comes: a writer killed in between, or whose requeue
    failed, leaves the run undecided, to reconcile (unless a later run of it has decided it already)."""
    kind = rec["kind"]
    if kind == "attempt_start":
        return {"step_start": rec.get("step")}
    if kind == "attempt_end":
        fields: AttemptFields = {
            "cause": rec.get("cause"),
            "step_end": rec.get("step_end"),
            "decision": rec.get("message"),
        }
        return fields if rec.get("requeue_follows") else {**fields, "requeued": int(bool(rec.get("requeued")))}
    if kind == "idle_cancel":  # the GPU sampler's decision (hpctrain.runtime.idle_cancel): final
        return {"cause": "idle", "requeued": 0, "decision": rec.get("message")}
    if kind == "requeue":
        fields = {"cause": rec.get("cause"), "decision": rec.get("message")}
        return {**fields, "step_end": rec.get("step")} if rec.get("checkpointed") else fields
    if kind == "requeued":
        return {"requeued": 1}
    return {"decision": f"requeue failed: {rec.get('message')}"}  # reconcile may try again


def _attempt(ledger: Ledger, rec: dict[str, Any]) -> None:
    """Into the run's attempts row (keyed like sacct's runs), and the job's events."""
    if rec.get("job_id") is not None and rec.get("attempt") is not None:
        ledger.attempts.record(rec["job_id"], rec.get("task_index", -1), rec["attempt"], **_attempt_fields(rec))
    if rec["kind"] != "attempt_start":
        _event(ledger, rec)


def _resubmitted(ledger: Ledger, rec: dict[str, Any]) -> None:
    """A job that went on under a new Slurm id (a follow-up job): the ledger follows it there."""
    job = ledger.jobs.get(rec["job_id"]) if rec.get("job_id") is not None else None
    if job is not None and not job["is_array"]:
        ledger.jobs.resubmitted(job["id"], rec["new_slurm_job_id"], rec["attempt_base"])
        ledger.jobs.set_state(job["id"], "PENDING", ended_at=None)
    _event(ledger, rec)


def _evaluation(ledger: Ledger, rec: dict[str, Any]) -> None:
    """An evaluation job's outcome on the checkpoint of another job (``of_job``): its values, or why it has none."""
    key = (rec["of_job"], rec.get("of_task", -1), rec["step"], rec["evaluator"])
    if ledger.jobs.get(key[0]) is None:
        raise ValueError(f"an evaluation of job {key[0]}, which this ledger does not have")
    if rec.get("metrics") is not None:
        ledger.evaluations.done(*key, metrics=rec["metrics"], at=rec["time"])
    else:
        ledger.evaluations.failed(*key, error=rec["error"], at=rec["time"])
    _event(ledger, rec)


# Kinds with a table of their own; every other kind (quarantine, ...) lands in events only.
HANDLERS: dict[str, Handler] = {
    "checkpoint": _checkpoint,
    "metrics": _metrics,
    "resubmitted": _resubmitted,
    "startup": _startup,
    "hang": _hang,
    "evaluation": _evaluation,
    UTILIZATION: _utilization,
    **dict.fromkeys(("attempt_start", "attempt_end", "requeue", "requeued", "requeue_failed", "idle_cancel"), _attempt),
}


def ingest_journal(ledger: Ledger, journal: Journal) -> int:
    """Fold every record not yet ingested, up to `BATCH` per write transaction (on a shared file system each
    is lock and sync round trips to the server); returns how many were new. Safe to run concurrently."""
    key = str(journal.dir.resolve())
    done = ledger.ingested.names(key)
    fresh = [(name, journal.read(name)) for name in journal.names() if name not in done]
    new = 0
    for start in range(0, len(fresh), BATCH):
        with ledger.transaction():
            for name, rec in fresh[start : start + BATCH]:
                if ledger.ingested.has(key, name):
                    continue  # another reconcile got there first
                new += _fold(ledger, key, name, rec, journal.dir / name)
    return new


def _fold(ledger: Ledger, key: str, name: str, rec: dict[str, Any], path: Path) -> bool:
    """One record (file ``path``) into the ledger, or a `journal_error` event saying why it could not be: a record
    that is refused, by its handler or by the schema, neither stops every later ingest nor leaves part of itself.
    Whether it was read (noted): a handler may leave it unread."""
    rec.setdefault("time", time.time())
    try:
        with ledger.transaction():  # a savepoint: what the handler wrote before it failed goes with it
            if HANDLERS.get(rec.get("kind", ""), _event)(ledger, rec) is False:
                return False
    except (AttributeError, IndexError, KeyError, TypeError, ValueError, sqlite3.IntegrityError) as exc:
        _event(
            ledger,
            {
                "kind": "journal_error",
                "time": time.time(),
                "job_id": rec.get("job_id"),
                "message": f"{path}: {exc!r}",
            },
        )
    ledger.ingested.add(key, name, rec.get("kind", "?"))
    return True
