"""The job spec of an interactive session: from `hpctrain notebook`'s flags alone, or from a user's job spec, whose
environment, setup lines, container, work directory and data paths it keeps (what works in the notebook then runs
unchanged as `hpctrain submit SPEC`)."""

from __future__ import annotations

from typing import Any

from hpctrain.config.job import JobSpec
from hpctrain.config.loading import validate

SERVE = ["python", "-m", "hpctrain.interactive.serve"]


def session_spec(
    base: JobSpec | None = None,
    *,
    gpus: int | None = None,
    time: str | None = None,
    partition: str | None = None,
    preemptible: bool | None = None,
    image: str | None = None,
    idle_minutes: float | None = None,
    port: int | None = None,
    shell: bool | None = None,
) -> JobSpec:
    """One node, one task (the server; kernels see all the node's GPUs of the allocation), never requeued (a
    kernel's state does not survive a requeue), no array, no evaluations or in-place restarts of the base spec's.
    Flags given override the base spec's resources; values are checked as a spec file's would be."""
    data: dict[str, Any] = base.model_dump(mode="json", by_alias=True, exclude_unset=True) if base else {}
    kind = "shell" if shell else "notebook"
    name = f"{base.name}-{kind}" if base else kind
    resources = {**data.get("resources", {}), "nodes": 1, "spare_nodes": 0, "tasks_per_node": 1}
    for key, value in (("gpus_per_node", gpus), ("time", time), ("partition", partition), ("preemptible", preemptible)):
        if value is not None:
            resources[key] = value
    interactive = {**data.get("interactive", {})}
    if idle_minutes is not None:
        interactive["idle_minutes"] = idle_minutes
    if port is not None:
        interactive["port"] = port
    if shell is not None:
        interactive["shell"] = shell
    for key in ("array", "eval", "retry", "hang", "dependency", "parallel", "checkpoint"):
        data.pop(key, None)
    data.update(
        name=name[:64],
        command=SERVE,
        launcher="srun",
        requeue=False,
        resources=resources,
        interactive=interactive,
    )
    if image is not None:
        data["container"] = {"image": image}
    return validate(JobSpec, data, "hpctrain notebook")
