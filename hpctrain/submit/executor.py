"""Submit Python functions from a login-node Python session: submitit's `SlurmExecutor`, through hpctrain.

    from hpctrain.submit.executor import Executor
    ex = Executor(site="dev")
    ex.update_parameters(nodes=1, gpus_per_node=2, time=60, account="auto", preemptible=True)
    job = ex.submit(train, cfg)              # or ex.map_array(fn, xs), or `with ex.batch(): ...`
    job.result()

submitit pickles the call, returns its `Job`s and reads their results; hpctrain does the rest, as for a
job spec: site config, placement (``account="auto"`` by fairshare, the preemptible QOS), arrays chunked
past MaxArraySize, the ledger (`status`, `show`, `cost`, `report`, `logs` see the job), lineage, the
retry policy, and the stop notices (`hpctrain.runtime.function`). What changes from submitit, and why:
- The batch script is hpctrain's (rendered from a `JobSpec` built from the parameters), not submitit's,
  so the requeue, journals and secrets work as for every hpctrain job; submitit parameters hpctrain has
  no place for are refused by name rather than ignored.
- The call's pickle is written into the job directory before sbatch (submitit writes it after, and the
  job waits up to 60 s for it).
- Waiting polls the ledger's `Poller`: one sacct for every active job of the site, which also keeps the
  ledger current (submitit's watcher runs its own sacct and records nothing).
"""

from __future__ import annotations

import math
import re
import shlex
import time
from typing import Annotated, Any

from pydantic import AfterValidator, Field, FiniteFloat, create_model
from submitit.core import logger
from submitit.core import utils as submitit_utils
from submitit.core.core import Job
from submitit.slurm.slurm import SlurmExecutor, SlurmInfoWatcher, SlurmJob

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.config.loading import StrictModel, validate
from hpctrain.config.site import SiteConfig
from hpctrain.config.types import ExpandedPath, MiB
from hpctrain.contract import JobPaths
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.jobs.poll import Poller
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit.submitter import Submission, Submitter

WHERE = "executor parameters"
# submitit's parameter -> the job spec's field (resources.* unless dotted otherwise).
SUBMITIT_FIELDS = {
    "job_name": "name",
    "partition": "partition",
    "time": "time",
    "nodes": "nodes",
    "ntasks_per_node": "tasks_per_node",
    "cpus_per_task": "cpus_per_task",
    "gpus_per_node": "gpus_per_node",
    "mem": "mem",
    "qos": "qos",
    "account": "account",
    "setup": "setup",
    "array_parallelism": "array.throttle",
    "dependency": "dependency",
}
# hpctrain's own parameters: the job spec's fields of the same names.
HPCTRAIN_FIELDS = {"preemptible": "preemptible", "requeue": "requeue", "env": "env", "workdir": "workdir"}


def _minutes(value: Any) -> Any:
    """submitit's time, in minutes; hpctrain also takes a Slurm time such as '04:00:00', and None (the site's)."""
    if value is None or isinstance(value, str) or (type(value) in (int, float) and 0 < value < math.inf):
        return value
    raise ValueError("expected a positive number of minutes or a Slurm time such as '04:00:00'")


Minutes = Annotated[Any, AfterValidator(_minutes)]
# The type of every parameter, submitit's generic names (timeout_min, mem_gb, ...) included, checked before submitit
# converts any; the job spec made of them checks their values. Each is optional: only those given are checked.
# (dict[str, Any]: a dict passed as **kwargs is checked against each of create_model's own keywords as well)
_PARAMETERS: dict[str, Any] = {
    name: (kind, None)
    for name, kind in {
        "name": str,
        "job_name": str,
        "timeout_min": Minutes,
        "time": Minutes,
        "mem_gb": Annotated[float, Field(gt=0, allow_inf_nan=False)],
        "mem": MiB | None,
        "nodes": int,
        "tasks_per_node": int | None,
        "ntasks_per_node": int | None,
        "cpus_per_task": int,
        "gpus_per_node": int,
        "partition": str | None,
        "qos": str | None,
        "account": str | None,
        "setup": list[str],
        "array_parallelism": int | None,
        "dependency": str,
        "preemptible": bool,
        "requeue": bool,
        "env": dict[str, Any],
        "workdir": ExpandedPath | None,
    }.items()
}
ExecutorParameters = create_model("ExecutorParameters", __base__=StrictModel, **_PARAMETERS)


class ExecutorOptions(StrictModel):
    """The executor's own settings, besides the site, ledger and Slurm client."""

    python: str | None = Field(None, description="the command running Python on the compute nodes")
    max_pickle_size_gb: FiniteFloat = Field(1.0, gt=0)


class LedgerWatcher(SlurmInfoWatcher):
    """submitit's job watcher, polling through hpctrain's ledger: one `Poller.refresh` (one sacct for all the
    site's active jobs) per ledger and site per update, whatever the number of jobs waited on; states are
    the ledger's."""

    def __init__(self, delay_s: int = 30) -> None:
        super().__init__(delay_s)
        self._pollers: dict[tuple[str, str], Poller] = {}
        self._source: dict[str, tuple[str, str]] = {}

    def track(self, job_id: str, ledger: Ledger, client: SlurmClient, site: str) -> None:
        key = (str(ledger.path), site)
        self._pollers.setdefault(key, Poller(ledger, client, site))
        self._source[job_id] = key
        self.register_job(job_id)

    def _poller(self, job_id: str) -> Poller:
        """The poller of a job this process submitted; for one loaded from a pickle, the default site's."""
        if job_id not in self._source:
            site = load_site(None)
            self.track(job_id, Ledger(site.ledger.path, mode=site.ledger.mode), SlurmClient.for_site(site), site.name)
        return self._pollers[self._source[job_id]]

    def update(self) -> None:
        waiting = self._registered - self._finished
        for poller in {id(p): p for p in map(self._poller, waiting)}.values():
            self._num_calls += 1
            try:
                poller.refresh()
            except HpctrainError as exc:  # as submitit's watcher: a wait outlives a Slurm outage
                logger.get_logger().warning(f"hpctrain: job states not refreshed: {exc}")
        for job_id in waiting:
            poller = self._poller(job_id)
            self._info_dict[job_id] = {"State": ledger_state(poller.ledger, poller.site, job_id)}
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)
        self._last_status_check = time.time()


def ledger_state(ledger: Ledger, site: str, job_id: str) -> str:
    """The ledger's state of Slurm job ``job_id`` ('123', or '123_4' for an array task); UNKNOWN when absent."""
    slurm_id, _, task = job_id.partition("_")
    row = ledger.jobs.by_slurm_id(site, slurm_id)
    if row is None:
        return "UNKNOWN"
    if task:
        return ledger.jobs.task_states(row["id"]).get(int(task), "PENDING")
    return row["state"]


class HpctrainJob(SlurmJob):
    """submitit's `Job` of a call submitted through hpctrain; ``ledger_id`` is its row in the ledger."""

    watcher = LedgerWatcher()
    ledger_id: int | None = None

    def _log(self) -> str | None:
        slurm_id, _, task = self.job_id.partition("_")
        path = JobPaths(self.paths.folder).output(slurm_id, int(task) if task else -1)
        return path.read_text(errors="replace") if path.exists() else None

    def stdout(self) -> str | None:
        """The job's log (hpctrain's batch script writes both streams, every rank's lines labelled)."""
        return self._log()

    def stderr(self) -> str | None:
        """The same log as `stdout`: hpctrain keeps one per job (or array task)."""
        return self._log()


def _job_name(value: Any) -> str:
    """A submitit job name (often a function's name) made a valid job-spec name."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", str(value)).lstrip("_.-")[:64]
    return name or "submitit"


class Executor(SlurmExecutor):
    """submitit's Slurm executor submitting through hpctrain (see the module's docstring). Parameters are
    submitit's (``time`` in minutes, ``mem`` such as "16GB", ``gpus_per_node``, ``array_parallelism``,
    ``setup``, and the generic ``timeout_min``, ``mem_gb``, ``tasks_per_node`` ...) plus hpctrain's
    ``preemptible``, ``requeue``, ``env`` and ``workdir``; ``account="auto"`` picks by fairshare."""

    job_class = HpctrainJob

    def __init__(
        self,
        site: str | SiteConfig | None = None,
        ledger: Ledger | None = None,
        client: SlurmClient | None = None,
        python: str | None = None,
        max_pickle_size_gb: float = 1.0,
    ):
        validate(ExecutorOptions, {"python": python, "max_pickle_size_gb": max_pickle_size_gb}, WHERE)
        self.site = site if isinstance(site, SiteConfig) else load_site(site)
        self.ledger = ledger or Ledger(self.site.ledger.path, mode=self.site.ledger.mode)
        self.client = client or SlurmClient.for_site(self.site)
        self.hpctrain_parameters: dict[str, Any] = {}
        super().__init__(self.site.paths.logs, python=python, max_pickle_size_gb=max_pickle_size_gb)

    def _internal_update_parameters(self, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in ExecutorParameters.model_fields:
                raise ConfigError(
                    f"{WHERE}: {name!r} is not supported by hpctrain's executor (supported: "
                    f"{', '.join(sorted(ExecutorParameters.model_fields))})"
                )
        validate(ExecutorParameters, kwargs, WHERE)
        generic = {k: kwargs.pop(k) for k in list(kwargs) if k in self._equivalence_dict()}
        kwargs.update(self._convert_parameters(generic))  # timeout_min -> time, mem_gb -> mem ("4GB") ...
        for name in [n for n in kwargs if n in HPCTRAIN_FIELDS]:
            self.hpctrain_parameters[name] = kwargs.pop(name)
        super()._internal_update_parameters(**kwargs)

    def job_spec(self, count: int) -> JobSpec:
        """The job spec of ``count`` calls (an array when more than one), from the parameters."""
        data: dict[str, Any] = {
            "name": "submitit",
            "resources": {},
            "command": [*shlex.split(self.python), "-u", "-m", "hpctrain.runtime.function"],
        }
        for name, value in [*self.parameters.items(), *self.hpctrain_parameters.items()]:
            key = SUBMITIT_FIELDS.get(name) or HPCTRAIN_FIELDS[name]
            if name == "time" and isinstance(value, (int, float)):
                value = f"{int(value)}:00"  # submitit's minutes; a bare number in a spec is seconds
            if key == "array.throttle":
                if count > 1:
                    data["array"] = {"count": count, "throttle": value}
            elif key == "dependency":  # sbatch's form, as submitit passes it: 'afterok:123:456'
                kind, *after = str(value).split(":")
                data["dependency"] = {"kind": kind, "after": after}
            elif key in ("name", "setup", "requeue", "env", "workdir"):
                data[key] = _job_name(value) if key == "name" else value
            else:
                data["resources"][key] = value
        data["resources"].setdefault("tasks_per_node", 1)  # submitit's default, not hpctrain's one per GPU
        if count > 1:
            data.setdefault("array", {"count": count})
        return validate(JobSpec, data, WHERE)

    def _internal_process_submissions(
        self, delayed_submissions: list[submitit_utils.DelayedSubmission]
    ) -> list[Job[Any]]:
        spec = self.job_spec(len(delayed_submissions))

        def write_calls(files: JobPaths) -> None:
            for index, delayed in enumerate(delayed_submissions):
                path = files.call(index)
                path.parent.mkdir(exist_ok=True)
                delayed.dump(path)
                if index == 0 and path.stat().st_size * len(delayed_submissions) > self.max_pickle_size_gb * 1024**3:
                    raise ConfigError(
                        f"{WHERE}: {len(delayed_submissions)} calls of {path.stat().st_size} bytes "
                        f"pickled exceed max_pickle_size_gb={self.max_pickle_size_gb}"
                    )

        sub = Submitter(self.site, self.ledger, self.client).submit(spec, WHERE, on_files=write_calls)
        return self._jobs(sub, spec)

    def _jobs(self, sub: Submission, spec: JobSpec) -> list[Job[Any]]:
        """submitit's jobs of a submission: one per call, in call order (array tasks across chunks)."""
        assert sub.files is not None
        tasks = list(range(spec.resources.nodes * spec.resources.ntasks_per_node))
        made: list[Job[Any]] = []
        for ledger_id, slurm_id, chunk in zip(sub.ledger_ids, sub.slurm_ids, sub.chunks):
            for job_id in [f"{slurm_id}_{t}" for t in range(chunk.count)] if chunk else [slurm_id]:
                job = HpctrainJob(folder=sub.files.job_dir, job_id=job_id, tasks=tasks)
                job.ledger_id = ledger_id
                HpctrainJob.watcher.track(job_id, self.ledger, self.client, self.site.name)
                made.append(job)
        return made
