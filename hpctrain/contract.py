"""The login/compute contract: the environment a job of hpctrain runs in, and the layout of its job directory.

The login side renders the batch script from these names (`hpctrain.submit.render` and the sbatch
templates); the compute side reads them back through `JobEnvironment`. No other module spells an
``HPCTRAIN_*`` variable (a test checks), and the ``SLURM_*`` variables a job reads are read here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Set by the user on the login node (and exported to the job: the site config it runs under).
SITE_ENV = "HPCTRAIN_SITE"
SITE_DIR_ENV = "HPCTRAIN_SITE_DIR"
LEDGER_ENV = "HPCTRAIN_LEDGER"
LOGIN_ENV = (SITE_ENV, SITE_DIR_ENV, LEDGER_ENV)

# Exported by hpctrain's batch script to the job's processes.
JOB_ID_ENV = "HPCTRAIN_JOB_ID"  # the ledger's id of the job
JOB_DIR_ENV = "HPCTRAIN_JOB_DIR"
JOURNAL_ENV = "HPCTRAIN_JOURNAL_DIR"
# The journal event of a trainer whose resumed runs will differ from an uninterrupted run; `status` flags its job.
RESUME_NOT_BITWISE = "resume_not_bitwise"
SPEC_ENV = "HPCTRAIN_SPEC"  # the spec as submitted (secrets redacted), JSON
SCRIPT_ENV = "HPCTRAIN_SCRIPT"  # the batch script itself, for a follow-up job where scontrol requeue fails
SIGNAL_LEAD_ENV = "HPCTRAIN_SIGNAL_LEAD_S"  # seconds between the sbatch notice and the end of the time limit
SEED_ENV = "HPCTRAIN_SEED"
PARAMS_ENV = "HPCTRAIN_PARAMS"  # an array task's (a sweep trial's) parameters, JSON
PARAM_INDEX_ENV = "HPCTRAIN_PARAM_INDEX"
NOTICE_FILE_ENV = "HPCTRAIN_NOTICE_FILE"  # where the batch script writes down each stop signal it gets
# Set by hpctrain on a resubmission: runs under earlier Slurm ids of the same ledger job.
ATTEMPT_BASE_ENV = "HPCTRAIN_ATTEMPT_BASE"
# Set by the batch script: how often this run has restarted its job step in the allocation (retry.in_place).
STEP_RESTART_ENV = "HPCTRAIN_STEP_RESTART"
# Set by each rank's task shim (hpctrain.launch.task) for its rank: the node-local file the rank's watchdog writes
# its current phase's deadline to (hpctrain.runtime.heartbeat).
HEARTBEAT_ENV = "HPCTRAIN_HEARTBEAT_FILE"
# Set by the batch script of a job whose [hang] output_s is set: its log may stay quiet this many seconds.
HANG_OUTPUT_ENV = "HPCTRAIN_HANG_OUTPUT_S"
# Set by the batch script of a job submitted to several placements at once (`submit --race K`): the file whose
# first claimant runs the command (hpctrain.runtime.race).
RACE_FILE_ENV = "HPCTRAIN_RACE_FILE"

# Set by an evaluation job (`hpctrain.evaluate`) for the user's evaluator command: the checkpoint it evaluates,
# its step and layout (JSON: dp, tp, pp), and the JSON file of metrics ({name: number}) it must write.
EVAL_CHECKPOINT_ENV = "HPCTRAIN_EVAL_CHECKPOINT"
EVAL_STEP_ENV = "HPCTRAIN_EVAL_STEP"
EVAL_LAYOUT_ENV = "HPCTRAIN_EVAL_LAYOUT"
EVAL_OUTPUT_ENV = "HPCTRAIN_EVAL_OUTPUT"

# Metric names the reference trainer journals and the login side reads (report, retention, sweeps): its
# held-out evaluation's loss and, for byte-level models, bits per byte.
EVAL_LOSS = "eval/loss"
EVAL_BPB = "eval/bpb"
EVAL_TIME = "eval/time_s"  # the seconds an evaluation held the training loop up

DEFAULT_SIGNAL_LEAD_S = 300.0
JOURNAL = "journal"  # a job folder's journal (hpctrain.ledger.journal)
UTILIZATION = "utilization"  # the kind of a node's GPU sampler's journal records (hpctrain.runtime.utilization)


@dataclass(frozen=True)
class JobPaths:
    """Where one submission keeps its files on the shared filesystem."""

    job_dir: Path

    @property
    def journal_dir(self) -> Path:
        return self.job_dir / JOURNAL

    def submission_tag(self, job_id: str) -> str:
        """The comment of one sbatch of one ledger job (unique to it: the ledger id alone is unique within one
        ledger, the logs folder is shared): how a submission whose answer was lost is found again."""
        return f"hpctrain:{self.job_dir.name}:{job_id}"

    @staticmethod
    def journal_of(job_dir: str) -> str:
        """``job_dir``'s journal as a string (a refresh lists 2,000 of them: Path objects cost 30 ms of `status`)."""
        return os.path.join(job_dir, JOURNAL)

    @property
    def spec_file(self) -> Path:
        return self.job_dir / "spec.json"

    @property
    def policy_file(self) -> Path:
        """The spec's run policy, resolved at submit (hpctrain.runtime.attempts.RunPolicy): the batch script's
        bookkeeping reads it without the spec's models."""
        return self.job_dir / "policy.json"

    @property
    def params_file(self) -> Path:
        return self.job_dir / "params.jsonl"

    @property
    def interruptions_file(self) -> Path:
        """The interruptions of jobs like this one in the ledger at submit, for checkpoints every "auto" steps."""
        return self.job_dir / "interruptions.json"

    @staticmethod
    def output_name(array: bool) -> str:
        """The batch script's log, as sbatch's --output pattern (per array task for an array)."""
        return "slurm-%A_%a.out" if array else "slurm-%j.out"

    def output(self, slurm_job_id: str, task: int = -1) -> Path:
        """The log (the script's stdout and stderr) of a job, or of task ``task`` of an array job."""
        if task < 0:
            return self.job_dir / self.output_name(False).replace("%j", slurm_job_id)
        return self.job_dir / self.output_name(True).replace("%A", slurm_job_id).replace("%a", str(task))

    def outputs(self) -> list[Path]:
        """The logs of a job that is not an array, one per Slurm id it ran under, oldest first."""
        found = {p: m for p in self.job_dir.glob("slurm-*.out") if (m := re.fullmatch(r"slurm-([0-9]+)\.out", p.name))}
        return sorted(found, key=lambda p: int(found[p][1]))

    def call(self, index: int) -> Path:
        """A submitted Python call (submitit's pickle), by array task parameter index (0 for a single job)."""
        return self.job_dir / "calls" / f"{index}.pkl"

    def secrets_file(self, job_id: int | str) -> Path:
        """A ledger job's secret values, readable by the submitting user only (see hpctrain.runtime.secret_file)."""
        return self.job_dir / f"secrets-{job_id}.env"

    @property
    def session_file(self) -> Path:
        """An interactive session's address and token, or why it could not start (hpctrain.interactive.serve);
        readable by the submitting user only."""
        return self.job_dir / "session.json"

    @property
    def stacks_dir(self) -> Path:
        """Python stacks of ranks found hung (hpctrain.runtime.watchdog), one file per rank and step."""
        return self.job_dir / "stacks"

    @property
    def idle_dir(self) -> Path:
        """Each node's mark that all its GPUs are idle, and the run's decision to end it for that
        (hpctrain.runtime.idle_cancel)."""
        return self.job_dir / "idle"

    def first_failure(self, step_id: str) -> Path:
        """Made by the first rank of a job step to fail (hpctrain.launch.task), so that only it reports."""
        return self.job_dir / "failed" / step_id

    @property
    def chunks_file(self) -> Path:
        """The chunks of a throttled array split past MaxArraySize, and its tasks ended (hpctrain.runtime.chunks)."""
        return self.job_dir / "chunks.json"

    @property
    def chunks_lock(self) -> Path:
        return self.job_dir / ".chunks.lock"

    @property
    def race_file(self) -> Path:
        """The race of a job submitted to several placements (the first submission's folder holds it)."""
        return self.job_dir / "race"

    def script(self, chunk_index: int = 0) -> Path:
        """The batch script of one chunk of the submission (arrays split past MaxArraySize)."""
        return self.job_dir / (f"job-{chunk_index}.sh" if chunk_index else "job.sh")


@dataclass(frozen=True)
class TaskLayout:
    """One srun task of a step, from Slurm's variables."""

    rank: int
    local_rank: int
    world_size: int
    tasks_per_node: str  # run-length coded per node: '4(x2),3'
    node_index: int


@dataclass(frozen=True)
class JobEnvironment:
    """What a process of a job knows from its environment: Slurm's variables and hpctrain's batch script's."""

    env: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def _int(self, name: str, default: int) -> int:
        value = self.env.get(name) or ""
        return int(value) if value.lstrip("-").isdigit() else default

    def _path(self, name: str) -> Path | None:
        value = self.env.get(name)
        return Path(value) if value else None

    @property
    def in_slurm(self) -> bool:
        return "SLURM_JOB_ID" in self.env

    @property
    def slurm_job_id(self) -> str | None:
        return self.env.get("SLURM_JOB_ID")

    @property
    def qos(self) -> str | None:
        """The QOS Slurm runs the job in (None outside Slurm)."""
        return self.env.get("SLURM_JOB_QOS")

    @property
    def allocation_id(self) -> int:
        """The array's job id for an array task, else the job id (KeyError outside Slurm)."""
        return int(self.env.get("SLURM_ARRAY_JOB_ID") or self.env["SLURM_JOB_ID"])

    @property
    def node_list(self) -> str:
        """The allocation's nodes as a Slurm hostlist ('' outside Slurm)."""
        return self.env.get("SLURM_JOB_NODELIST") or self.env.get("SLURM_NODELIST") or ""

    @property
    def step_node_count(self) -> int:
        """How many nodes this job step runs on (the allocation's outside a step; 1 outside Slurm)."""
        env = self.env
        return int(env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)

    @property
    def ntasks(self) -> str | None:
        return self.env.get("SLURM_NTASKS")

    @property
    def tasks_per_node(self) -> str:
        """The allocation's tasks per node, run-length coded as Slurm gives them ('4(x2),3')."""
        return self.env.get("SLURM_NTASKS_PER_NODE") or self.env.get("SLURM_TASKS_PER_NODE") or "1"

    @property
    def task_layout(self) -> TaskLayout:
        """This srun task's place in its step; KeyError naming the first variable missing outside a task."""
        env = self.env
        return TaskLayout(
            int(env["SLURM_PROCID"]),
            int(env["SLURM_LOCALID"]),
            int(env.get("SLURM_STEP_NUM_TASKS") or env["SLURM_NTASKS"]),
            env.get("SLURM_STEP_TASKS_PER_NODE") or env["SLURM_TASKS_PER_NODE"],
            int(env.get("SLURM_NODEID", "0")),
        )

    @property
    def local_rank(self) -> int:
        """This task's index among the job step's tasks on its node."""
        return self._int("SLURM_LOCALID", 0)

    @property
    def gpu_ids(self) -> list[str]:
        """The GPUs this job step was given on its node, as Slurm numbers them (its gres indices, the devices'
        minor numbers): the step's, else the job's, else the numeric entries of CUDA_VISIBLE_DEVICES."""
        for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
            ids = [part.strip() for part in self.env.get(name, "").split(",") if part.strip().isdigit()]
            if ids:
                return ids
        return []

    @property
    def job_id(self) -> int | None:
        """The ledger's id of the job, under hpctrain's batch script."""
        value = self.env.get(JOB_ID_ENV, "")
        return int(value) if value.isdigit() else None

    @property
    def task_index(self) -> int:
        """This array task's index; -1 outside an array."""
        return self._int("SLURM_ARRAY_TASK_ID", -1)

    @property
    def param_index(self) -> int:
        """This array task's parameter set: its line in the job's params.jsonl; 0 outside an array."""
        return max(self._int(PARAM_INDEX_ENV, 0), 0)

    @property
    def restart_count(self) -> int:
        """How often Slurm has requeued this job (this Slurm id)."""
        return self._int("SLURM_RESTART_COUNT", 0)

    @property
    def step_restarts(self) -> int:
        """How often this run has restarted its job step inside the allocation."""
        return self._int(STEP_RESTART_ENV, 0)

    @property
    def run_number(self) -> int:
        """This run's attempt number, as the ledger counts them: Slurm's requeue count, plus the runs under
        earlier Slurm ids when hpctrain had to resubmit the job."""
        return self._int(ATTEMPT_BASE_ENV, 0) + self.restart_count

    @property
    def requeue_target(self) -> str:
        """`<array job>_<task>` for an array task (never the whole array), else the job id."""
        if self.env.get("SLURM_ARRAY_JOB_ID") and self.env.get("SLURM_ARRAY_TASK_ID"):
            return f"{self.env['SLURM_ARRAY_JOB_ID']}_{self.env['SLURM_ARRAY_TASK_ID']}"
        return self.env["SLURM_JOB_ID"]

    @property
    def rank(self) -> int:
        return self._int("RANK", self._int("SLURM_PROCID", 0))

    @property
    def node(self) -> str:
        import socket  # the CLI imports this module at start-up: socket only when asked

        return self.env.get("SLURMD_NODENAME") or socket.gethostname()

    @property
    def slurm_step(self) -> str | None:
        """This job step as Slurm names it, ``<job>.<step>``."""
        return f"{self.slurm_job_id}.{self.env['SLURM_STEP_ID']}" if "SLURM_STEP_ID" in self.env else None

    @property
    def step_id(self) -> str:
        """An id of this job step's run that every rank computes alike (Slurm's ids; '' outside Slurm)."""
        if not self.in_slurm:
            return ""
        return f"slurm{self.slurm_job_id}.{self.env.get('SLURM_STEP_ID', 0)}-r{self.restart_count}"

    @property
    def site(self) -> str | None:
        return self.env.get(SITE_ENV) or None

    @property
    def job_dir(self) -> Path | None:
        return self._path(JOB_DIR_ENV)

    @property
    def journal_dir(self) -> Path | None:
        return self._path(JOURNAL_ENV)

    @property
    def race_file(self) -> Path | None:
        """The race this job runs in, when it was submitted to several placements at once."""
        return self._path(RACE_FILE_ENV)

    @property
    def spec_file(self) -> Path | None:
        return self._path(SPEC_ENV)

    @property
    def script(self) -> Path | None:
        return self._path(SCRIPT_ENV)

    @property
    def notice_file(self) -> Path | None:
        return self._path(NOTICE_FILE_ENV)

    @property
    def heartbeat_file(self) -> Path | None:
        return self._path(HEARTBEAT_ENV)

    @property
    def hang_output_s(self) -> float:
        """How long the job's log may stay quiet before its step counts as hung (0: no limit)."""
        try:
            return float(self.env.get(HANG_OUTPUT_ENV) or 0)
        except ValueError:
            return 0.0

    def output(self) -> Path | None:
        """This job's (or array task's) log, where hpctrain's batch script has it; None outside one."""
        if self.job_dir is None or not self.in_slurm:
            return None
        return JobPaths(self.job_dir).output(str(self.allocation_id), self.task_index)

    @property
    def signal_lead_s(self) -> float:
        return float(self.env.get(SIGNAL_LEAD_ENV) or DEFAULT_SIGNAL_LEAD_S)

    @property
    def params(self) -> dict[str, Any] | None:
        """An array task's (a sweep trial's) parameters; None outside one."""
        import json

        value = self.env.get(PARAMS_ENV)
        return json.loads(value) if value else None

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """The spec's ``hyperparameters`` with this array task's (sweep trial's) undotted parameters applied, as
        `JobSpec.with_params` applies them; {} outside an hpctrain job."""
        import json

        spec = json.loads(self.spec_file.read_text(encoding="utf-8")) if self.spec_file else {}
        undotted = {k: v for k, v in (self.params or {}).items() if "." not in k}
        return {**spec.get("hyperparameters", {}), **undotted}
