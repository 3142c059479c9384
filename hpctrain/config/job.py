"""The job spec: what one training job needs and how it is laid out."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import Field, model_validator

from hpctrain.config.loading import Loc, StrictModel, load_model
from hpctrain.config.types import ExpandedPath, MiB, Seconds

JOB_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class Resources(StrictModel):
    nodes: int = Field(1, ge=1)
    gpus_per_node: int = Field(0, ge=0)
    tasks_per_node: int | None = Field(None, ge=1, description="default: one per GPU, else 1")
    cpus_per_task: int = Field(1, ge=1)
    mem: MiB | None = Field(None, description="per node")
    time: Seconds | None = Field(None, description="default: the site's")
    partition: str | None = None
    account: str | None = Field(None, description="an account name, or 'auto' for the best fairshare")
    qos: str | None = None
    preemptible: bool = Field(False, description="run in the site's preemptible QOS")

    @property
    def ntasks_per_node(self) -> int:
        return self.tasks_per_node or max(self.gpus_per_node, 1)


class Parallel(StrictModel):
    dp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    micro_batch: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp


class Data(StrictModel):
    index: ExpandedPath | None = Field(None, description="the shard index written by `hpctrain data pack`")
    workers: int = Field(2, ge=0)
    shuffle_buffer: int = Field(1000, ge=0)
    max_quarantined_fraction: float = Field(0.05, ge=0, le=1)


class CheckpointPolicy(StrictModel):
    dir: ExpandedPath | None = Field(None, description="default: <site checkpoints>/<job name>")
    every_steps: int | None = Field(None, ge=1)
    every_minutes: float | None = Field(None, gt=0)
    keep_last: int = Field(3, ge=1)
    async_save: bool = Field(True, alias="async")


class EnvVar(StrictModel):
    """An environment entry; a secret one is read from the submitter's environment, never written down."""

    value: str | None = None
    secret: bool = False

    @model_validator(mode="before")
    @classmethod
    def _plain_string(cls, data: Any) -> Any:
        return {"value": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _value_or_secret(self) -> "EnvVar":
        if self.value is None and not self.secret:
            raise ValueError("expected a value, or secret = true to take it from the submitting environment")
        return self


class JobSpec(StrictModel):
    name: str = Field(pattern=JOB_NAME)
    command: list[str] = Field(min_length=1, description="argv run once per task, e.g. ['python', 'train.py']")
    workdir: ExpandedPath | None = None
    resources: Resources = Field(default_factory=Resources)
    parallel: Parallel = Field(default_factory=Parallel)
    data: Data = Field(default_factory=Data)
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    hyperparameters: dict[str, Any] = Field(default_factory=dict)
    seed: int = 0
    env: dict[str, EnvVar] = Field(default_factory=dict)
    launcher: Literal["srun", "none"] = Field("srun", description="srun: one task per GPU; none: run once")

    def problems(self) -> Iterator[tuple[Loc, str]]:
        for key in self.env:
            if not re.match(ENV_NAME, key):
                yield ("env", key), "expected an environment variable name (letters, digits, _)"
        r, p = self.resources, self.parallel
        total = r.nodes * r.ntasks_per_node
        if p.world_size > 1 and p.world_size != total:
            yield ("parallel",), (
                f"dp*tp*pp = {p.dp}*{p.tp}*{p.pp} = {p.world_size} must equal "
                f"nodes*tasks_per_node = {r.nodes}*{r.ntasks_per_node} = {total}"
            )

    def secret_names(self) -> list[str]:
        return [k for k, v in self.env.items() if v.secret]


def load_job_spec(path: str | os.PathLike[str]) -> JobSpec:
    return load_model(JobSpec, Path(path))
