"""The ledger's rows as its table classes give and take them: dicts whose keys and value types are the columns of
`hpctrain.ledger.schema` (a test holds them equal). A ``*_json`` column reads as JSON text; where a table class
takes one to write, it takes the object too (encoded on the way in)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, TypedDict

if TYPE_CHECKING:
    from typing_extensions import Required


class NewJob(TypedDict, total=False):
    """A submission's job as `Jobs.record` takes it: name and site, and what placement chose."""

    name: Required[str]
    site: Required[str]
    user: str | None
    account: str | None
    partition: str | None
    qos: str | None
    is_array: int
    spec_json: Any
    choice_reason: str | None
    sweep_id: str | None
    lineage_json: Any
    group_id: int | None
    param_offset: int | None
    race: str | None


class JobTimes(TypedDict, total=False):
    """When a job started and ended, as `Jobs.set_state` sets them with its state (None: not yet)."""

    started_at: float | None
    ended_at: float | None


class _JobColumns(TypedDict):
    """The columns of `jobs` but its Slurm id."""

    id: int
    name: str
    site: str
    user: str | None
    account: str | None
    partition: str | None
    qos: str | None
    is_array: int
    state: str
    submitted_at: float | None
    started_at: float | None
    ended_at: float | None
    spec_json: str | None
    script_sha256: str | None
    script_path: str | None
    choice_reason: str | None
    sweep_id: str | None
    lineage_json: str | None
    updated_at: float | None
    group_id: int | None
    job_dir: str | None
    param_offset: int | None
    error: str | None
    attempt_base: int
    journal_read_at: float | None
    usage_settled_at: float | None
    sacct_digest: str | None
    race: str | None  # the race file of a submission to several placements, of which one runs (`submit --race`)


class JobRow(_JobColumns):
    """A row of `jobs`: one sbatch (an array's chunk is one each), its Slurm id None until sbatch took it."""

    slurm_job_id: str | None


class SubmittedJob(_JobColumns):
    """A row of `jobs` that sbatch took."""

    slurm_job_id: str


class JobSummary(TypedDict):
    """A job as `Jobs.summaries` lists it: its row's main facts, its array tasks' count and states ("STATE:n,..."),
    its restarts and preemptions."""

    id: int
    name: str
    site: str
    slurm_job_id: str | None
    state: str
    account: str | None
    qos: str | None
    partition: str | None
    is_array: int
    group_id: int | None
    race: str | None
    sweep_id: str | None
    submitted_at: float | None
    started_at: float | None
    ended_at: float | None
    tasks: int
    task_states: str | None
    restarts: int
    preemptions: int


class NewTask(TypedDict):
    """An array task as `Jobs.record` takes it: its index and its line of parameters."""

    task_index: int
    param_index: int
    params_json: str


class ArrayTaskRow(NewTask):
    """A row of `array_tasks`."""

    job_id: int
    state: str
    restarts: int
    updated_at: float | None


class AttemptFields(TypedDict, total=False):
    """A run's columns besides its key, as `Attempts.record` sets any of them: Slurm's view of the run, what it
    achieved (steps, cause) and the decision taken after it."""

    slurm_job_id: str | None
    state: str | None
    node_list: str | None
    started_at: float | None
    ended_at: float | None
    exit_code: str | None
    alloc_gpus: int | None
    reason: str | None
    cause: str | None
    step_start: int | None
    step_end: int | None
    requeued: int | None
    decision: str | None
    elapsed_s: int | None
    gpu_s: float | None
    idle_gpu_s: float | None


class AttemptRow(AttemptFields):
    """A row of `attempts`: one run of a job (task index -1) or array task, numbered from 0; every column is there."""

    id: int
    job_id: int
    task_index: int
    attempt: int


class RunFacts(TypedDict):
    """A started run as GPU-hours are measured from (`Attempts.unsettled_usage`): its row's times and GPUs, its
    job's facts, and when its last checkpoint was made."""

    job_id: int
    task_index: int
    attempt: int
    gpus: int | None
    started_at: float
    ended_at: float | None
    elapsed_s: int | None
    gpu_s: float | None
    idle_gpu_s: float | None
    cause: str | None
    name: str
    account: str | None
    user: str | None
    sweep_id: str | None
    partition: str | None
    site: str
    interactive: int  # 1 for a session's run (`hpctrain notebook`)
    last_checkpoint_at: float | None


class Interruptions(NamedTuple):
    """How often runs of jobs alike were interrupted so as to lose work (`Attempts.interruptions`): all such
    interruptions, those of them that were job steps restarted in place, and the seconds the runs ran."""

    events: int
    in_place: int
    exposure_s: float


class NewCheckpoint(TypedDict):
    """A checkpoint as its job journaled it (`Checkpoints.record`); None where the record did not say."""

    job_id: int | None
    task_index: int
    step: int | None
    path: str
    state: str | None
    created_at: float
    bytes: int | None
    duration_s: float | None
    manifest_sha256: str | None
    metric_name: str | None
    metric_value: float | None
    note: str | None


class CheckpointRow(TypedDict):
    """A row of `checkpoints`: one checkpoint directory of a job's task, its state (committed, deleted, corrupt)."""

    id: int
    job_id: int | None
    task_index: int
    step: int
    path: str
    state: str
    created_at: float
    bytes: int | None
    duration_s: float | None
    manifest_sha256: str | None
    metric_name: str | None
    metric_value: float | None
    note: str | None


class EvaluationRow(TypedDict):
    """A row of `evaluations`: an evaluator's run on one checkpoint of a job's task, by the job ``eval_job_id``
    (submitted to Slurm under the job name ``submission_key``); ``state`` requested, submitted, done
    (``metrics_json`` holds its values), failed (``error`` says why) or expired (its submission never reached
    Slurm)."""

    job_id: int
    task_index: int
    step: int
    evaluator: str
    checkpoint: str
    eval_job_id: int | None
    state: str
    metrics_json: str | None
    error: str | None
    requested_at: float
    done_at: float | None
    submission_key: str | None
    seq: int  # its place in the order values reached the ledger (set anew when its values change)


class MetricSummary(TypedDict):
    """One metric of a run, as `Metrics.summary` gives it: its last value and its best, with their steps."""

    last_step: int
    last: float
    best_step: int
    best: float
    points: int


class MetricRow(TypedDict):
    """A row of `metrics`: one value of one metric at one step of a job's task (``attempt``: its restart count)."""

    job_id: int
    task_index: int
    name: str
    step: int
    value: float | None
    attempt: int | None
    time: float | None
    seq: int  # its place in the order values reached the ledger (set anew when the value changes)


class SweepRow(TypedDict):
    """A row of `sweeps`."""

    id: str
    name: str
    method: str
    state: str
    spec_json: str | None
    created_at: float
    updated_at: float | None


class TrialRow(TypedDict):
    """A row of `trials`: one point a sweep suggested, and the array task that runs it once submitted."""

    sweep_id: str
    number: int
    params_json: str
    state: str
    job_id: int | None
    task_index: int | None
    failures: int
    value: float | None
    reason: str | None
    updated_at: float | None


class TrialTask(TypedDict):
    """A trial with its array task's state (`Sweeps.trials_with_tasks`); ``unsent``: its job's sbatch failed."""

    number: int
    params_json: str
    trial_state: str
    job_id: int | None
    task_index: int | None
    failures: int
    value: float | None
    slurm_job_id: str | None
    unsent: int | None
    task_state: str | None


class TrialSummary(TypedDict):
    """A trial as `Sweeps.table` lists it, with its job's Slurm id and its GPU-hours so far."""

    number: int
    params_json: str
    state: str
    value: float | None
    failures: int
    reason: str | None
    slurm_job_id: str | None
    task_index: int | None
    gpu_hours: float | None


class EventRow(TypedDict):
    """A row of `events`: ``data_json`` holds the event's data, a JSON object."""

    id: int
    time: float
    kind: str
    job_id: int | None
    message: str | None
    data_json: str | None


class LoggedEvent(EventRow):
    """An event with its data decoded."""

    data: dict[str, Any]


class SegmentKey(TypedDict):
    """The key of a `segments` row: one start of a job step (``step_restart``) within a run (``attempt``)."""

    job_id: int
    task_index: int
    attempt: int
    step_restart: int


class SegmentRow(SegmentKey):
    """A row of `segments`."""

    main_at: float | None
    loaded_at: float | None
    resumed_from: int | None
    tier: str | None
    steps: int
    step_seconds: float
    last_step: int | None
    last_step_at: float | None
    hung: int


class GpuUseRow(SegmentKey):
    """A row of `gpu_use`: one GPU of one job step start on one node, as its sampler last summed it up."""

    node: str
    device: str
    kind: str  # nvml, or cpu (the local rank's processes stand for its GPU)
    samples: int
    seconds: float
    mean: float | None  # percent
    p10: float | None
    mem_peak: float | None  # bytes
    mem_total: float | None
    energy_j: float | None
    idle_s: float  # held idle (below the policy's percent, for at least its minutes)
    idle_now_s: float  # idle since (0: busy at the last reading)
    below_percent: float  # the job's [idle] policy the sampler counted by
    after_s: float
    alert_s: float
    at: float  # the record's time
    final: int  # the step had ended


class GpuPoint(TypedDict):
    """A row of `gpu_timeline`: the minute from ``at`` of one node of a job (task), each GPU's mean utilization in
    percent and its peak memory in MiB, JSON objects by GPU."""

    job_id: int
    at: float
    task_index: int
    node: str
    util: str
    mem: str


class SiteCacheRow(TypedDict):
    """A row of `site_cache`: one value (JSON) cached for a site, and when it was fetched."""

    site: str
    key: str
    value_json: str | None
    fetched_at: float


class IngestedRow(TypedDict):
    """A row of `journal_ingested`: a journal record (by file name) already folded into the ledger."""

    journal: str
    name: str
    kind: str
    ingested_at: float


class ModelRow(TypedDict):
    """A row of `registered_models`: a named model and the gate its promotions pass (an evaluator's metric, lower
    or higher better, and an optional threshold)."""

    name: str
    gate_evaluator: str
    gate_metric: str
    gate_mode: str
    gate_threshold: float | None
    created_at: float
    created_by: str


class VersionRow(TypedDict):
    """A row of `model_versions`: one immutable version, the checkpoint of (job, task, step) it names and that
    checkpoint's manifest digest, with the job's lineage as it was at registration."""

    model: str
    version: int
    job_id: int
    task_index: int
    step: int
    checkpoint: str
    manifest_sha256: str
    lineage_json: str
    registered_at: float
    registered_by: str


class AliasRow(TypedDict):
    """A row of `model_aliases`: where an alias of a model points now."""

    model: str
    alias: str
    version: int
    moved_at: float


class AliasMoveRow(TypedDict):
    """A row of `alias_moves`: one move of an alias (promote, force or rollback; ``undoes``: the move a rollback
    undid), by whom, why, and the gate's numbers (``gate_json``) it was decided on."""

    id: int
    model: str
    alias: str
    action: str
    from_version: int | None
    to_version: int | None
    undoes: int | None
    at: float
    by: str
    why: str | None
    gate_json: str | None


class TrackerExportRow(TypedDict):
    """A row of `tracker_exports`: the run a tracker holds for a job's task, and how far it was sent (metric values
    and evaluation results up to ``sent_seq``, the job's ``state`` then)."""

    tracker: str
    job_id: int
    task_index: int
    run_id: str
    sent_seq: int
    state: str | None
    exported_at: float
