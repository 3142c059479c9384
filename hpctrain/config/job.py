"""The job spec: what one training job needs and how it is laid out."""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal, cast

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    FiniteFloat,
    ModelWrapValidatorHandler,
    PlainValidator,
    field_validator,
    model_validator,
)

from hpctrain.config.loading import (
    Loc,
    StrictModel,
    as_resolved,
    format_loc,
    load_model,
    read_mapping,
    secret_variables,
    validate,
)
from hpctrain.config.policies import HangPolicy, IdlePolicy
from hpctrain.config.shell import check_shell_command
from hpctrain.config.types import (
    ENV_NAME,
    Argument,
    BindPath,
    ExpandedPath,
    ImageRef,
    MiB,
    MinutesOrAuto,
    Seconds,
    SlurmName,
    StepsOrAuto,
    check_not_option,
    parse_slurm_time,
)
from hpctrain.contract import EVAL_CHECKPOINT_ENV, EVAL_LOSS, EVAL_OUTPUT_ENV, PARAMS_ENV

JOB_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
MAX_ARRAY_TASKS = 100_000  # per submission: every task's parameters are held in memory and in the ledger
SLURM_ID_MAX = 2**32 - 1  # Slurm's job and array task ids are 32-bit
LEDGER_ID_MAX = 2**63 - 1  # ledger ids are SQLite integers
EVAL_TIME_S = 30 * 60  # an evaluation job's time limit unless [eval] time says
MAX_EVAL_TIME_S = 7 * 86400


AUTO_CHUNK_S = 3 * 3600  # `time = "auto"`: runs of 3 h (cluv's chunks: shorter ones requeue too often)


def _times(values: list[Any]) -> list[int] | None:
    """Each of ``values`` as a time limit in seconds; None if one is none."""
    try:
        return [parse_slurm_time(v) for v in values]
    except ValueError:
        return None


def _slurm_job_id(value: str) -> str:
    if not re.fullmatch(r"[0-9]{1,10}(_[0-9]{1,10})?", value) or max(map(int, value.split("_"))) > SLURM_ID_MAX:
        raise ValueError(f"expected a Slurm job id such as '1234' or '1234_5' (numbers up to {SLURM_ID_MAX})")
    return value


def _int_as_text(value: Any) -> Any:
    """A job id written as a TOML integer (1234) reads as its digits ("1234")."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _text_as_int(value: Any) -> Any:
    """A ledger id written as a string ("12") reads as the integer."""
    return int(value) if isinstance(value, str) and re.fullmatch(r"[0-9]{1,19}", value) else value


def _shell_line(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError("expected one shell line per item")
    return value


def _not_json(value: Any) -> Loc | None:
    """Where in ``value`` is the first part that JSON would refuse or change (a date, bytes, a set, inf or NaN, a
    table with a key that is not text); None when JSON holds all of it as it is."""
    if value is None or isinstance(value, (str, int)) or (isinstance(value, float) and math.isfinite(value)):
        return None
    items: Iterable[tuple[Any, Any]]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        items = value.items()
    elif isinstance(value, (list, tuple)):  # a tuple (given in Python) is written as the list it reads back as
        items = enumerate(value)
    else:
        return ()
    return next(((key, *inner) for key, item in items if (inner := _not_json(item)) is not None), None)


def _json_value(value: Any) -> Any:
    """Array parameters and hyperparameters travel as JSON (params.jsonl, $HPCTRAIN_PARAMS, spec.json, the ledger)."""
    if (inner := _not_json(value)) is not None:
        raise ValueError(
            "expected JSON data: text, a finite number, true or false, null, or a list or a table (text "
            "keys) of them" + (f"; {format_loc(inner)} is not" if inner else "")
        )
    return value


SlurmJobId = Annotated[str, BeforeValidator(_int_as_text), AfterValidator(_slurm_job_id)]
LedgerId = Annotated[int, BeforeValidator(_text_as_int), Field(ge=1, le=LEDGER_ID_MAX)]
JsonValue = Annotated[Any, AfterValidator(_json_value)]
SetupLine = Annotated[str, AfterValidator(_shell_line), AfterValidator(check_shell_command)]


def _argv(value: list[str]) -> list[str]:
    if not value or not value[0].strip():
        raise ValueError("expected the program to run as the first item")
    check_not_option(value[0])
    return value


def _preemptible(value: Any) -> bool | Literal["allowed"]:
    """One line for a bad value (a union's validation would give one a member)."""
    if value is True or value is False or value == "allowed":
        return cast("bool | Literal['allowed']", value)
    raise ValueError('expected true, false or "allowed"')


class Resources(StrictModel):
    nodes: int = Field(1, ge=1, description="nodes the job step runs on; `nodes = [4, 2]`: 4, or 2 (`shapes`)")
    shapes: list[int] | None = Field(
        None,
        description=(
            "the node counts the job may start on, preferred first (`nodes = [4, 2]` sets nodes 4 and these): "
            "`hpctrain where` ranks each; Slurm is asked for all, and starts the job (and each requeued run) on as "
            "many nodes as it can without delay; the step runs on the largest shape it was given"
        ),
    )
    spare_nodes: int = Field(
        0,
        ge=0,
        description=(
            "more nodes allocated and held in reserve: a step restarted in the allocation (retry.in_place) runs on them "
            "in place of a node that failed or was excluded, in the same layout"
        ),
    )
    gpus_per_node: int = Field(0, ge=0)
    tasks_per_node: int | None = Field(None, ge=1, description="default: one per GPU, else 1")
    cpus_per_task: int = Field(1, ge=1)
    mem: MiB | None = Field(None, description="per node")
    time: Seconds | None = Field(
        None,
        description='default: the site\'s; `time = ["24:00:00", "04:00:00"]`: 24 h, or runs of 4 h where those '
        'start sooner (`time_chunks`); `"auto"`: the site\'s, or runs of 3 h',
    )
    time_chunks: list[Seconds] | None = Field(
        None,
        description="shorter time limits the job may be submitted with: each run checkpoints at its limit's notice and "
        "is requeued, the next resuming from it (cluv's chunks); `hpctrain where` ranks each, `submit --soonest` "
        "takes the soonest",
    )
    partition: SlurmName | None = None
    account: SlurmName | None = Field(None, description="an account name, or 'auto' for the best fairshare")
    qos: SlurmName | None = None
    preemptible: Annotated[bool | Literal["allowed"], PlainValidator(_preemptible)] = Field(
        False,
        description="run in the site's preemptible QOS; \"allowed\": in it or in the site's QOS, whichever starts "
        "sooner (`hpctrain where`, `submit --soonest`; a plain `submit` takes the site's QOS)",
    )

    @model_validator(mode="before")
    @classmethod
    def _nodes_as_shapes(cls, data: Any) -> Any:
        """`nodes = [4, 2]`: the first is `nodes`, all of them `shapes` (a list of anything but counts is refused
        as `nodes`, in one line)."""
        if isinstance(data, dict) and isinstance(nodes := data.get("nodes"), list):
            if "shapes" in data:
                raise ValueError("give nodes as a list or shapes, not both")
            if nodes and all(type(n) is int and n >= 1 for n in nodes):
                return {**data, "nodes": nodes[0], "shapes": nodes}
        return data

    @field_validator("nodes", mode="before")
    @classmethod
    def _no_other_list(cls, value: Any) -> Any:
        if isinstance(value, list):
            raise ValueError(f"expected a node count of at least 1, or a list of them (the shapes), got {value!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _time_as_chunks(cls, data: Any) -> Any:
        """`time = ["24:00:00", "04:00:00"]`: the first is `time`, the others `time_chunks`; "auto": 3-hour chunks
        (a list of anything but time limits, longest first, is refused as `time`, in one line)."""
        if not isinstance(data, dict) or not isinstance(time := data.get("time"), (list, str)):
            return data
        if (time == "auto" or isinstance(time, list)) and "time_chunks" in data:
            raise ValueError('give time as a list or "auto", or time_chunks, not both')
        if time == "auto":
            return {**data, "time": None, "time_chunks": [AUTO_CHUNK_S // 60]}
        limits = _times(time) if isinstance(time, list) and len(time) > 1 else None
        if limits and all(a > b for a, b in itertools.pairwise(limits)):
            return {**data, "time": time[0], "time_chunks": time[1:]}
        return data

    @field_validator("time", mode="before")
    @classmethod
    def _no_other_time_list(cls, value: Any) -> Any:
        if isinstance(value, list):
            raise ValueError(
                "expected a Slurm time, a list of them longest first (the run's, then shorter runs it may go in) or "
                f'"auto", got {value!r}'
            )
        return value

    @model_validator(mode="after")
    def _shapes_hold_nodes(self) -> Resources:
        if self.shapes is not None:
            if not self.shapes or min(self.shapes) < 1 or len(set(self.shapes)) != len(self.shapes):
                raise ValueError(f"shapes: expected distinct node counts of at least 1, got {self.shapes}")
            if self.nodes not in self.shapes:
                raise ValueError(f"shapes: {self.shapes} must hold nodes = {self.nodes}")
            if self.spare_nodes and len(self.shapes) > 1:
                raise ValueError("spare_nodes: a job of several shapes keeps none (it runs on the largest it is given)")
        return self

    @property
    def node_counts(self) -> list[int]:
        """The node counts the job may start on, preferred first."""
        return list(self.shapes) if self.shapes else [self.nodes]

    def slurm_nodes(self, size_strings: bool) -> str:
        """sbatch's ``--nodes`` (spares included): one count, or the shapes, of which Slurm allocates as many nodes
        as it can without delaying the start: a list ("2,4") where the controller reads one (``size_strings``:
        `SlurmVersion.has_node_count_lists`), else their range ("2-4"; the step then runs on the largest shape the
        allocation holds, the rest wait as spares)."""
        counts = sorted(n + self.spare_nodes for n in self.node_counts)
        if len(counts) == 1:
            return str(counts[0])
        if size_strings and counts[-1] - counts[0] + 1 != len(counts):
            return ",".join(map(str, counts))
        return f"{counts[0]}-{counts[-1]}"

    @property
    def ntasks_per_node(self) -> int:
        return self.tasks_per_node or max(self.gpus_per_node, 1)

    @property
    def allocated_nodes(self) -> int:
        """The nodes asked of Slurm: the step's and the spares."""
        return self.nodes + self.spare_nodes

    @property
    def allocated_gpus(self) -> int:
        return self.allocated_nodes * self.gpus_per_node


class Parallel(StrictModel):
    dp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    micro_batch: int = Field(1, ge=1)
    grad_accum: int = Field(1, ge=1)
    global_batch: int | None = Field(None, ge=1, description="checked against micro_batch * grad_accum * dp")
    zero_stage: int = Field(0, ge=0, le=3)
    precision: Literal["fp32", "bf16"] = "fp32"

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def samples_per_step(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp


class Model(StrictModel):
    """Shape of the model, for layout checks (and the reference GPT)."""

    layers: int = Field(4, ge=1)
    heads: int = Field(4, ge=1)
    hidden: int = Field(64, ge=1)
    vocab: int = Field(256, ge=2)
    seq_len: int = Field(64, ge=2)


class Data(StrictModel):
    index: ExpandedPath | None = Field(None, description="the shard index written by `hpctrain data pack`")
    workers: int = Field(2, ge=0)
    shuffle_buffer: int = Field(1000, ge=0)
    max_quarantined_fraction: FiniteFloat = Field(0.05, ge=0, le=1)
    cache: Literal["node", "off"] | None = Field(
        None,
        description='"node": shards read through the node\'s cache (site [cache]); default "node" where it has one',
    )


class GatePolicy(StrictModel):
    """What a model version must show to be promoted (`hpctrain model promote`): its result from ``evaluator`` on
    ``metric`` no worse than the alias's current target's, and within ``threshold`` where one is set."""

    evaluator: Annotated[str, Field(pattern=JOB_NAME)] = Field(
        "heldout", description="the evaluator whose results decide (heldout, or one of [eval] evaluators)"
    )
    metric: str = Field(EVAL_LOSS, min_length=1, max_length=200, description="the metric of its results that decides")
    mode: Literal["min", "max"] = Field("min", description="min: lower is better; max: higher is better")
    threshold: FiniteFloat | None = Field(
        None, description="the value the metric must reach (at most it with min, at least it with max)"
    )


class EvalPolicy(StrictModel):
    """Held-out evaluation in the reference trainer's loop: the same samples every time, never trained on."""

    index: ExpandedPath | None = Field(None, description="a held-out shard index (no shard shared with data.index)")
    holdout: FiniteFloat = Field(
        0,
        ge=0,
        lt=1,
        description="or this share of data.index's shards (at least one), chosen by their names' hashes, "
        "held out of training",
    )
    every_steps: int | None = Field(None, ge=1, description="evaluate every this many steps, and at the last")
    batches: int = Field(
        4, ge=1, description="evaluate on this many global batches (parallel.global_batch samples each)"
    )
    on_checkpoint: bool = Field(
        False,
        description="evaluate each committed checkpoint in an evaluation job, newest first, with every evaluator "
        "(`hpctrain reconcile` and `hpctrain eval --follow` submit them)",
    )
    max_pending: int = Field(2, ge=1, description="with on_checkpoint: evaluation jobs of this job in flight at most")
    skip_superseded: bool = Field(
        False, description="with on_checkpoint: evaluate only checkpoints newer than the newest one asked for"
    )
    evaluators: dict[Annotated[str, Field(pattern=JOB_NAME)], Annotated[list[Argument], AfterValidator(_argv)]] = Field(
        default_factory=dict,
        description="evaluation jobs' own evaluators (`hpctrain eval --evaluator NAME`): NAME = argv, run with the "
        f"checkpoint in ${EVAL_CHECKPOINT_ENV}, writing a JSON object of metrics to ${EVAL_OUTPUT_ENV}",
    )
    time: Seconds = Field(
        EVAL_TIME_S,
        le=MAX_EVAL_TIME_S,
        description="the time limit of each evaluation job (a Slurm time, 7 days at most)",
    )
    gate: GatePolicy = Field(
        default_factory=GatePolicy, description="the gate of the models registered from this job (`hpctrain model`)"
    )

    @property
    def enabled(self) -> bool:
        """Whether the spec names held-out data."""
        return self.index is not None or self.holdout > 0


class CheckpointPolicy(StrictModel):
    dir: ExpandedPath | None = Field(None, description="default: <site checkpoints>/<job name>")
    every_steps: StepsOrAuto | None = Field(
        None, description='"auto": from the saves\' measured cost and the rate of interruptions'
    )
    every_minutes: MinutesOrAuto | None = Field(
        None, description='in steps of the measured step time; "auto" as for every_steps'
    )
    keep_last: int = Field(3, ge=1)
    keep_best: int = Field(0, ge=0, description="also keep this many best checkpoints by best_metric")
    best_metric: str = Field(
        "loss", min_length=1, description="a metric the checkpoint records: loss (training), eval/loss, eval/bpb"
    )
    best_mode: Literal["min", "max"] = "min"
    async_save: bool = Field(True, alias="async")
    memory_every_steps: StepsOrAuto | None = Field(
        None,
        description="also checkpoint to node-local memory (site checkpoint.memory_dir) this often, for "
        'restarts inside the allocation (retry.in_place); "auto": from the memory saves\' measured cost and the rate '
        "of restarts in place",
    )


class ArraySpec(StrictModel):
    """Run the job once per parameter set, as a Slurm job array (split past MaxArraySize)."""

    params: list[dict[str, JsonValue]] = Field(default_factory=list, description="explicit parameter sets")
    grid: dict[str, Annotated[list[JsonValue], Field(min_length=1)]] = Field(
        default_factory=dict, description="cartesian product of these lists"
    )
    count: int | None = Field(None, ge=1, le=MAX_ARRAY_TASKS, description="plain copies, when there are no parameters")
    throttle: int | None = Field(None, ge=1, le=MAX_ARRAY_TASKS, description="at most this many tasks at once (%N)")

    def parameter_sets(self) -> list[dict[str, Any]]:
        if self.grid:
            keys = list(self.grid)
            return [dict(zip(keys, values)) for values in itertools.product(*self.grid.values())]
        if self.params:
            return list(self.params)
        return [{} for _ in range(self.count or 0)]

    @property
    def size(self) -> int:
        """How many tasks ``parameter_sets`` gives, without building them."""
        if self.grid:
            return math.prod(map(len, self.grid.values()))
        return len(self.params) or self.count or 0


class Dependency(StrictModel):
    after: list[SlurmJobId] = Field(default_factory=list, description="Slurm job ids this job waits for")
    after_jobs: list[LedgerId] = Field(
        default_factory=list,
        description=(
            "ledger ids this job waits for (every chunk of each one's submission), resolved to Slurm ids at submit"
        ),
    )
    kind: Literal["afterok", "afterany", "afternotok"] = "afterok"
    singleton: bool = False


class RetryPolicy(StrictModel):
    """Which stopped runs hpctrain requeues, and when it gives up."""

    on_error: bool = Field(
        False,
        description="also requeue after an error exit or OOM kill (preemption, time "
        "limit and node failure always are, while requeue is on)",
    )
    max_stalled_attempts: int = Field(
        3, ge=1, description="give up after this many consecutive attempts without checkpoint progress"
    )
    in_place: int = Field(
        0,
        ge=0,
        le=100,
        description="restarts of a failed job step (a rank that exits non-zero "
        "or is killed) inside the same allocation, from the newest "
        "checkpoint, before the run ends and the rules above decide",
    )
    exclude_node_after: int = Field(
        2,
        ge=0,
        description="leave a node out of the run once its ranks were the first to fail in this many of its job "
        "steps (0: never; the run ends and is requeued when too few nodes are left)",
    )


class EnvVar(StrictModel):
    """An environment entry; a secret one is read from the submitter's environment, never written down."""

    value: str | None = None
    secret: bool = False

    @model_validator(mode="before")
    @classmethod
    def _plain_string(cls, data: Any) -> Any:
        return {"value": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _value_or_secret(self) -> EnvVar:
        if self.value is None and not self.secret:
            raise ValueError("expected a value, or secret = true to take it from the submitting environment")
        return self


class Container(StrictModel):
    """The image the job's tasks run in, with the site's runtime (site `[containers]`)."""

    image: ImageRef = Field(
        description="pyxis: an enroot image ('nvcr.io#nvidia/pytorch:24.05-py3') or .sqsh file; "
        "Apptainer: a .sif file or a sandbox directory"
    )
    mounts: list[BindPath] = Field(default_factory=list, description="more host paths, after the site's binds")
    workdir: ExpandedPath | None = Field(None, description="inside the container (default: the job's workdir)")


class Interactive(StrictModel):
    """An interactive session (`hpctrain notebook`): JupyterLab on the compute node, ended when idle."""

    idle_minutes: FiniteFloat = Field(
        60, gt=0, le=7 * 24 * 60, description="end the session after this long with no kernel activity"
    )
    port: int = Field(0, ge=0, le=65535, description="the server's port on the node (0: a free one)")
    shell: bool = Field(
        False, description="hold the allocation for shells (`srun --jobid J --overlap --pty`) instead of JupyterLab"
    )


class JobSpec(StrictModel):
    name: str = Field(pattern=JOB_NAME)
    command: Annotated[list[Argument], AfterValidator(_argv)] = Field(
        min_length=1, description="argv run once per task, e.g. ['python', 'train.py']"
    )
    workdir: ExpandedPath | None = None
    setup: list[SetupLine] = Field(
        default_factory=list,
        description=("shell lines run before the command, after the site's setup: `module load ...`, `source env.sh`"),
    )
    resources: Resources = Field(default_factory=Resources)
    parallel: Parallel = Field(default_factory=Parallel)
    model: Model | None = None
    data: Data = Field(default_factory=Data)
    eval: EvalPolicy = Field(default_factory=EvalPolicy)
    checkpoint: CheckpointPolicy = Field(default_factory=CheckpointPolicy)
    hyperparameters: dict[str, JsonValue] = Field(default_factory=dict)
    seed: int = Field(
        0,
        ge=0,
        lt=2**32,
        description="0 to 2**32 - 1, as numpy's generators take (torch's overflow "
        "past 2**64 with the numbers the trainer derives from it)",
    )
    env: dict[str, EnvVar] = Field(default_factory=dict)
    launcher: Literal["srun", "none"] = Field("srun", description="srun: one task per GPU; none: run once")
    container: Container | None = None
    requeue: bool = Field(True, description="let Slurm requeue the job after preemption or node failure")
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    hang: HangPolicy = Field(default_factory=HangPolicy)
    idle: IdlePolicy = Field(default_factory=IdlePolicy)
    array: ArraySpec | None = None
    dependency: Dependency = Field(default_factory=Dependency)
    interactive: Interactive | None = Field(None, description="a session a user works in (`hpctrain notebook`)")

    @model_validator(mode="wrap")
    @classmethod
    def _paths_without_secrets(cls, data: Any, handler: ModelWrapValidatorHandler[JobSpec]) -> JobSpec:
        """Path fields expand ``$NAME`` from the submitting environment, never a secret's."""
        env = data.get("env") if isinstance(data, dict) else None
        names = [k for k, v in env.items() if isinstance(v, dict) and v.get("secret")] if isinstance(env, dict) else []
        with secret_variables(names):
            return handler(data)

    def problems(self) -> Iterator[tuple[Loc, str]]:
        for key in self.env:
            if not re.fullmatch(ENV_NAME, key):
                yield ("env", key), "expected an environment variable name (letters, digits, _)"
        if self.array is not None:
            a = self.array
            if sum(map(bool, (a.params, a.grid, a.count))) != 1:
                yield ("array",), "expected exactly one of params, grid or count"
            elif a.size > MAX_ARRAY_TASKS:
                yield (
                    ("array", "grid" if a.grid else "params"),
                    (f"{a.size} tasks, more than the {MAX_ARRAY_TASKS} one submission may have"),
                )
        if self.resources.spare_nodes and not (self.retry.in_place and self.launcher == "srun"):
            yield (
                ("resources", "spare_nodes"),
                ("spare nodes serve restarts inside the allocation only: set retry.in_place and launcher = 'srun'"),
            )
        yield from self._chunk_problems()
        if self.checkpoint.every_steps is not None and self.checkpoint.every_minutes is not None:
            yield ("checkpoint", "every_minutes"), "give every_steps or every_minutes, not both"
        if self.checkpoint.memory_every_steps and not self.retry.in_place:
            yield (
                ("checkpoint", "memory_every_steps"),
                ("the memory tier serves restarts inside the allocation only: set retry.in_place too"),
            )
        if self.interactive is not None and (self.array is not None or self.resources.nodes > 1):
            yield ("interactive",), "a session runs on one node and is no array: set resources.nodes = 1, no [array]"
        yield from self._layout_problems()
        yield from self._eval_problems()

    def _chunk_problems(self) -> Iterator[tuple[Loc, str]]:
        r = self.resources
        if r.time_chunks is None:
            return
        if not r.time_chunks or len(set(r.time_chunks)) != len(r.time_chunks):
            yield ("resources", "time"), "time_chunks: expected distinct time limits"
        elif r.time is not None and max(r.time_chunks) >= r.time:
            yield ("resources", "time"), "each of time_chunks must be shorter than time, the run's whole"
        if not self.requeue:
            yield (
                ("resources", "time"),
                "a run in chunks is requeued at each chunk's limit: set requeue = true, or give one time limit",
            )

    def _eval_problems(self) -> Iterator[tuple[Loc, str]]:
        e = self.eval
        if e.index is not None and e.holdout:
            yield ("eval", "holdout"), "give eval.index or eval.holdout, not both"
        if e.holdout and self.data.index is None:
            yield ("eval", "holdout"), "holds out shards of data.index: set data.index too"
        if e.every_steps and not e.enabled:
            yield ("eval", "every_steps"), "evaluates held-out data: set eval.index or eval.holdout"
        if e.on_checkpoint and not e.evaluators and not (e.enabled and self.model is not None):
            yield (
                ("eval", "on_checkpoint"),
                (
                    "nothing to evaluate with: give held-out data and a [model] (the heldout evaluator) or [eval] evaluators"
                ),
            )
        if "heldout" in e.evaluators:
            yield ("eval", "evaluators", "heldout"), "is hpctrain's own evaluator: give yours another name"
        c = self.checkpoint
        if c.keep_best and c.best_metric.startswith("eval/") and not e.enabled:
            yield ("checkpoint", "best_metric"), f"{c.best_metric} needs held-out data: set eval.index or eval.holdout"

    def _layout_problems(self) -> Iterator[tuple[Loc, str]]:
        """The dp x tp x pp layout must fill the allocation, keep TP on a node and divide the model."""
        r, p, m = self.resources, self.parallel, self.model
        total = r.nodes * r.ntasks_per_node
        if p.world_size > 1 and p.world_size != total:
            yield (
                ("parallel",),
                (
                    f"dp*tp*pp = {p.dp}*{p.tp}*{p.pp} = {p.world_size} must equal "
                    f"nodes*tasks_per_node = {r.nodes}*{r.ntasks_per_node} = {total}"
                ),
            )
        if r.ntasks_per_node % p.tp:
            yield (
                ("parallel", "tp"),
                (
                    f"tp = {p.tp} must divide the {r.ntasks_per_node} tasks per node (tensor-parallel peers share a node)"
                ),
            )
        if p.world_size > 1:
            for n in r.node_counts:
                if n != r.nodes and (why := self._shape_problem(n)):
                    yield ("resources", "nodes"), why
        if p.global_batch is not None and p.global_batch != p.samples_per_step:
            yield (
                ("parallel", "global_batch"),
                (
                    f"global_batch = {p.global_batch} must equal micro_batch*grad_accum*dp = "
                    f"{p.micro_batch}*{p.grad_accum}*{p.dp} = {p.samples_per_step}"
                ),
            )
        if m is not None:
            if m.layers % p.pp:
                yield ("model", "layers"), f"layers = {m.layers} must be divisible by pp = {p.pp}"
            if m.heads % p.tp:
                yield ("model", "heads"), f"heads = {m.heads} must be divisible by tp = {p.tp}"
            if m.hidden % p.tp:
                yield ("model", "hidden"), f"hidden = {m.hidden} must be divisible by tp = {p.tp}"
            if m.hidden % m.heads:
                yield ("model", "hidden"), f"hidden = {m.hidden} must be divisible by heads = {m.heads}"

    def with_params(self, params: dict[str, Any], where: str = f"${PARAMS_ENV}") -> JobSpec:
        """This spec with an array task's (a sweep trial's) parameters applied: ``lr`` sets hyperparameters.lr,
        a dotted key such as ``parallel.micro_batch`` any other field."""
        data = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        for key, value in params.items():
            *parents, leaf = key.split(".") if "." in key else ("hyperparameters", key)
            node = data
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        return validate(JobSpec, data, where)

    def _shape_problem(self, nodes: int) -> str | None:
        """Why the layout cannot run on ``nodes`` of its shapes, keeping tp, pp and the global batch; None if it can."""
        r, p = self.resources, self.parallel
        tasks = nodes * r.ntasks_per_node
        if tasks % (p.tp * p.pp):
            return f"{nodes} nodes hold {tasks} tasks, which tp*pp = {p.tp * p.pp} does not divide"
        dp = tasks // (p.tp * p.pp)
        if p.samples_per_step % (p.micro_batch * dp):
            return (
                f"on {nodes} nodes dp = {dp}: the global batch of {p.samples_per_step} samples is no whole number of "
                f"micro_batch*dp = {p.micro_batch * dp}"
            )
        return None

    def shaped(self, nodes: int) -> JobSpec:
        """This spec on ``nodes`` (one of its shapes): the data-parallel width follows the nodes, and gradient
        accumulation keeps the global batch (a checkpoint of another shape resumes resharded)."""
        r, p = self.resources, self.parallel
        resources = r.model_copy(update={"nodes": nodes, "shapes": None})
        # A layout that is not one of the spec's nodes (a single process's default on several tasks) stays as it is.
        if nodes == r.nodes or p.world_size != r.nodes * r.ntasks_per_node or self._shape_problem(nodes):
            return self.model_copy(update={"resources": resources})
        dp = nodes * r.ntasks_per_node // (p.tp * p.pp)
        parallel = p.model_copy(
            update={
                "dp": dp,
                "grad_accum": p.samples_per_step // (p.micro_batch * dp),
                "global_batch": p.samples_per_step,
            }
        )
        return self.model_copy(update={"resources": resources, "parallel": parallel})

    def on_nodes(self, nodes: int) -> JobSpec:
        """This spec as a job step of ``nodes`` runs it: another of its shapes where Slurm allocated one (a job
        started or requeued on fewer or more nodes than it was submitted with), else itself."""
        if self.resources.shapes and nodes != self.resources.nodes and nodes in self.resources.shapes:
            return self.shaped(nodes)
        return self

    def secret_names(self) -> list[str]:
        return [k for k, v in self.env.items() if v.secret]

    def redacted(self) -> dict[str, Any]:
        """The spec as JSON-ready data with every secret value replaced: safe for the ledger and logs."""
        data = self.model_dump(mode="json", by_alias=True)
        for name in self.secret_names():
            data["env"][name]["value"] = "<secret>" if data["env"][name]["value"] is not None else None
        return data


def load_job_spec(path: str | os.PathLike[str]) -> JobSpec:
    return load_model(JobSpec, Path(path))


def recorded_job_spec(data: dict[str, Any], where: Path | str) -> JobSpec:
    """A spec as submit recorded it (the ledger's, a job's spec.json): its paths were expanded then, and are kept."""
    with as_resolved():
        return validate(JobSpec, data, where)


def load_recorded_job_spec(path: Path) -> JobSpec:
    """A job's spec.json (see `recorded_job_spec`)."""
    return recorded_job_spec(read_mapping(path), path)
