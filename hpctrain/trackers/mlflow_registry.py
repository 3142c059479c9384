"""The registry's versions and aliases mirrored into MLflow's model registry (`export mlflow`): a version found
again by its hpctrain tag before one is made; aliases moved or removed only where hpctrain set them (the model's tag
``hpctrain.aliases`` lists those), so that an alias someone set in MLflow itself stays."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import ModelRow, VersionRow

if TYPE_CHECKING:
    from mlflow import MlflowClient

VERSION_TAG = "hpctrain.version"
ALIASES_TAG = "hpctrain.aliases"  # on a registered model: the aliases hpctrain set there (JSON list)


def mirror_registry(ledger: Ledger, client: MlflowClient, runs: dict[tuple[int, int], str]) -> tuple[int, list[str]]:
    """The registry's versions whose runs are in ``runs`` ((job, task) -> MLflow run id), as MLflow model versions
    sourced from those runs, and their aliases; returns (versions made, aliases moved as ``model@alias``)."""
    made, moved = 0, []
    for model in ledger.registry.models():
        name = model["name"]
        versions = [v for v in ledger.registry.versions(name) if (v["job_id"], v["task_index"]) in runs]
        if versions:
            have, n = _versions(client, model, versions, runs)
            made += n
            moved += _aliases(ledger, client, name, have)
    return made, moved


def _versions(
    client: MlflowClient, model: ModelRow, versions: list[VersionRow], runs: dict[tuple[int, int], str]
) -> tuple[dict[int, str], int]:
    """The MLflow version of each hpctrain version (made where missing); and how many were made."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode

    name = model["name"]
    try:
        client.create_registered_model(name, tags={"hpctrain.gate_metric": model["gate_metric"]})
    except MlflowException as exc:
        if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
    have = {
        int(mv.tags[VERSION_TAG]): mv.version
        for mv in client.search_model_versions(f"name = '{name}'")
        if VERSION_TAG in mv.tags
    }
    made = 0
    for v in versions:
        if v["version"] in have:
            continue
        run_id = runs[(v["job_id"], v["task_index"])]
        created = client.create_model_version(
            name,
            f"runs:/{run_id}/checkpoint",
            run_id,
            tags={
                VERSION_TAG: str(v["version"]),
                "hpctrain.checkpoint": v["checkpoint"],
                "hpctrain.step": str(v["step"]),
                "hpctrain.manifest_sha256": v["manifest_sha256"],
            },
            description=f"hpctrain {name}:{v['version']}: job {v['job_id']} step {v['step']}",
            await_creation_for=0,  # nothing to copy: the source is the run, the files stay where they are
        )
        have[v["version"]] = created.version
        made += 1
    return have, made


def _aliases(ledger: Ledger, client: MlflowClient, name: str, have: dict[int, str]) -> list[str]:
    """Point hpctrain's aliases of model ``name`` where its registry does; remove those it set and no longer has.
    The aliases it is about to set are listed in ALIASES_TAG first, so a kill in between leaves them its own."""
    mirrored = client.get_registered_model(name)
    owned = set(json.loads(mirrored.tags.get(ALIASES_TAG) or "[]"))
    wanted = {a["alias"]: have[a["version"]] for a in ledger.registry.aliases(name) if a["version"] in have}
    if not set(wanted) <= owned:
        client.set_registered_model_tag(name, ALIASES_TAG, json.dumps(sorted(owned | set(wanted))))
    moved = []
    for alias, version in sorted(wanted.items()):
        if str(mirrored.aliases.get(alias)) != str(version):
            client.set_registered_model_alias(name, alias, str(version))
            moved.append(f"{name}@{alias}")
    for alias in sorted(owned - set(wanted)):
        if alias in mirrored.aliases:
            client.delete_registered_model_alias(name, alias)
    if owned - set(wanted):
        client.set_registered_model_tag(name, ALIASES_TAG, json.dumps(sorted(wanted)))
    return moved
