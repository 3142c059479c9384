"""Model versions: a job's committed checkpoint registered under a model's name as its next immutable version, the
checkpoint pinned against retention, the job's lineage and the checkpoint's manifest digest kept with it."""

from __future__ import annotations

import getpass
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.naming import MANIFEST
from hpctrain.checkpoint.pins import pin, pin_lock, pin_records, pins, unpin
from hpctrain.config.job import GatePolicy, JobSpec
from hpctrain.errors import CheckpointError, HpctrainError
from hpctrain.evaluate.run import Target
from hpctrain.evaluate.submit import job_spec, targets
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import JobRow, ModelRow, VersionRow
from hpctrain.registry.gate import Gate
from hpctrain.registry.names import Ref, RegistryError, check_model_name

NewVersion = tuple[ModelRow, dict[str, Any]]  # the model's row (new or not) and the version's columns


def register(
    ledger: Ledger, name: str, job_id: int, step: int | None = None, task: int | None = None, gate: Gate | None = None
) -> VersionRow:
    """``register_checkpoint``'s version."""
    return register_checkpoint(ledger, name, job_id, step, task, gate)[0]


def register_checkpoint(
    ledger: Ledger, name: str, job_id: int, step: int | None = None, task: int | None = None, gate: Gate | None = None
) -> tuple[VersionRow, bool]:
    """Register job ``job_id``'s checkpoint at ``step`` (default: its newest) of array task ``task`` as the next
    version of model ``name``: (the version, True); (the version it is already, False). A new model takes ``gate``,
    or the job spec's [eval.gate]; an existing one keeps its own (``gate`` must then be None).

    The checkpoint is pinned, and the version added, holding the directory's pin lock (see checkpoint.pins): the
    pins of this ledger without a version (a registration killed or failed) are removed under it first, and a
    failed registration removes the pin it wrote."""
    check_model_name(name)
    model = ledger.registry.model(name)
    if model is not None and gate is not None:
        raise RegistryError(f"model {name}: has its gate already ({Gate.of_model(model)}); give no gate options")
    job = ledger.jobs.get(job_id)
    if job is None:
        raise RegistryError(f"job {job_id}: no such ledger id (see `hpctrain status --all`)")
    found = targets(ledger, job, None if step is None else [step], every=False, task=task)
    if len(found) > 1:
        tasks = ", ".join(str(t.task_index) for t in found)
        raise RegistryError(f"job {job_id}: has checkpoints of tasks {tasks}: give one with --task")
    target = found[0]
    ckpt = Path(target.checkpoint)
    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt}: job {job_id}'s checkpoint of step {target.step} is gone")
    owner = str(ledger.path.resolve())
    record = {"ledger": owner, "model": name, "job_id": job_id, "task_index": target.task_index, "step": target.step}
    with pin_lock(ckpt.parent):
        _drop_orphans(ledger, ckpt.parent, owner)
        known = ledger.registry.version_of(name, job_id, target.task_index, target.step)
        if known is not None:
            if ckpt.is_dir():  # a pin removed by hand comes back
                pin(ckpt, name, record)
            return known, False
        had = name in pins(ckpt)
        pin(ckpt, name, record)
        try:
            number, created = ledger.registry.add_version(*_new_version(model, name, job, target, gate))
        except BaseException:
            if not had:
                unpin(ckpt, name)
            raise
    version = ledger.registry.version(name, number)
    assert version is not None
    return version, created


def _drop_orphans(ledger: Ledger, directory: Path, owner: str) -> None:
    """Remove the pins this ledger wrote in ``directory`` that name no version (their registration failed)."""
    for ckpt, label, record in pin_records(directory):
        if record.get("ledger") != owner or record.get("model") != label:
            continue
        job_id, task, step = (record.get(k) for k in ("job_id", "task_index", "step"))
        if not (isinstance(job_id, int) and isinstance(task, int) and isinstance(step, int)):
            continue
        if ledger.registry.version_of(label, job_id, task, step) is None:
            unpin(ckpt, label)


def _new_version(model: ModelRow | None, name: str, job: JobRow, target: Target, gate: Gate | None) -> NewVersion:
    """The rows of the version (and of the model, if it is new) for the pinned checkpoint ``target``."""
    ckpt = Path(target.checkpoint)
    try:  # the manifest alone, parsed without the checkpoint stack (login nodes may lack tensorstore)
        raw = (ckpt / MANIFEST).read_bytes()
        manifest = json.loads(raw)
    except OSError as exc:
        raise CheckpointError(f"{ckpt}: cannot register it: {exc.strerror}: {MANIFEST}") from None
    except ValueError:
        raise CheckpointError(f"{ckpt}: cannot register it: {MANIFEST} is not JSON") from None
    if not isinstance(manifest, dict) or manifest.get("step") != target.step:
        raise CheckpointError(f"{ckpt}: cannot register it: {MANIFEST} is not the manifest of step {target.step}")
    spec = job_spec(job) if job["spec_json"] else None
    chosen = gate or Gate.of(spec.eval.gate if spec else GatePolicy())
    new_model: ModelRow = {
        "name": name,
        "gate_evaluator": chosen.evaluator,
        "gate_metric": chosen.metric,
        "gate_mode": chosen.mode,
        "gate_threshold": chosen.threshold,
        "created_at": time.time(),
        "created_by": getpass.getuser(),
    }
    lineage: dict[str, Any] = {
        **json.loads(job["lineage_json"] or "{}"),
        "job": {"id": job["id"], "name": job["name"], "slurm_job_id": job["slurm_job_id"], "site": job["site"]},
        "checkpoint": {
            "step": target.step,
            "task": target.task_index,
            "world_size": manifest.get("world_size"),
            "metrics": manifest.get("metrics") or {},
        },
        "model_shape": spec.model.model_dump() if spec and spec.model else None,
    }
    return model or new_model, {
        "job_id": job["id"],
        "task_index": target.task_index,
        "step": target.step,
        "checkpoint": str(ckpt.absolute()),
        "manifest_sha256": hashlib.sha256(raw).hexdigest(),
        "lineage_json": lineage,
        "registered_at": time.time(),
        "registered_by": getpass.getuser(),
    }


def model_of(ledger: Ledger, name: str) -> ModelRow:
    check_model_name(name)
    model = ledger.registry.model(name)
    if model is None:
        known = ", ".join(m["name"] for m in ledger.registry.models()[:10]) or "none yet"
        raise RegistryError(f"model {name!r}: not registered (models: {known})")
    return model


def resolve(ledger: Ledger, ref: Ref) -> VersionRow:
    """The version ``ref`` names: by number, by alias, or the newest."""
    model_of(ledger, ref.model)
    if ref.alias is not None:
        alias = ledger.registry.alias(ref.model, ref.alias)
        if alias is None:
            have = ", ".join(a["alias"] for a in ledger.registry.aliases(ref.model)) or "none"
            raise RegistryError(f"{ref}: model {ref.model} has no alias {ref.alias!r} (aliases: {have})")
        number = alias["version"]
    elif ref.version is not None:
        number = ref.version
    else:
        number = ledger.registry.versions(ref.model)[-1]["version"]
    version = ledger.registry.version(ref.model, number)
    if version is None:
        newest = ledger.registry.versions(ref.model)[-1]["version"]
        raise RegistryError(f"{ref}: model {ref.model} has versions 1 to {newest}")
    return version


def spec_of(ledger: Ledger, version: VersionRow) -> JobSpec:
    """The job spec of the job a version's checkpoint came from."""
    job = ledger.jobs.get(version["job_id"])
    if job is None or not job["spec_json"]:
        raise HpctrainError(f"{version['model']}:{version['version']}: job {version['job_id']} has no spec")
    return job_spec(job)


def results(ledger: Ledger, version: VersionRow) -> dict[str, dict[str, Any]]:
    """The evaluations of the version's checkpoint: evaluator -> its metrics (or its state, while it has none)."""
    return {
        e["evaluator"]: json.loads(e["metrics_json"]) if e["metrics_json"] else {"state": e["state"]}
        for e in ledger.evaluations.of_job(version["job_id"])
        if (e["task_index"], e["step"]) == (version["task_index"], version["step"])
    }


def aliases_of(ledger: Ledger, version: VersionRow) -> list[str]:
    """The aliases of its model that point at the version."""
    return [a["alias"] for a in ledger.registry.aliases(version["model"]) if a["version"] == version["version"]]
