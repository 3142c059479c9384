"""Submit a job spec: place it, render it, record it in the ledger, sbatch it."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.config.job import JobSpec
from hpctrain.config.loading import format_problems
from hpctrain.config.site import SiteConfig
from hpctrain.config.types import MAX_ARG_STRLEN
from hpctrain.contract import PARAMS_ENV, JobPaths
from hpctrain.errors import ConfigError, HpctrainError, SlurmTimeout
from hpctrain.files import write_json_atomic
from hpctrain.jobs.unsent import submitting
from hpctrain.ledger import Ledger
from hpctrain.runtime import chunks as chunk_table
from hpctrain.runtime import secret_file
from hpctrain.runtime.attempts import RunPolicy
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit.arrays import ArrayChunk, plan_chunks
from hpctrain.submit.limits import max_array_size
from hpctrain.submit.lineage import lineage as build_lineage
from hpctrain.submit.placement import Placement, choose_placement
from hpctrain.submit.render import render_script

HISTORY_DAYS = 30  # the ledger's runs of jobs alike that "auto" checkpoint intervals learn from

OnRecord = Callable[[int, ArrayChunk | None], None]
OnFiles = Callable[[JobPaths], None]


@dataclass
class Submission:
    """What one `submit` did (or, for a dry run, would do)."""

    placement: Placement
    scripts: list[str]
    ledger_ids: list[int] = field(default_factory=list)
    slurm_ids: list[str] = field(default_factory=list)
    chunks: list[ArrayChunk | None] = field(default_factory=list)
    files: JobPaths | None = None

    @property
    def group_id(self) -> int | None:
        return self.ledger_ids[0] if self.ledger_ids else None


def secret_env(spec: JobSpec, where: Path | str) -> dict[str, str]:
    """Values of the spec's secret entries, from the submitting environment."""
    env, missing = {}, []
    for name, var in spec.env.items():
        if var.secret:
            value = os.environ.get(name) or var.value
            if value is None:
                missing.append((("env", name), "marked secret but not set in the submitting environment"))
            else:
                env[name] = value
    if missing:
        raise ConfigError(format_problems(where, missing))
    return env


def params_lines(spec: JobSpec, where: Path | str) -> list[str]:
    """Each array task's parameter set as the JSON line that params.jsonl holds and the batch script exports as
    $HPCTRAIN_PARAMS; ConfigError for a set too long for one environment entry (each program the task started
    would fail with "Argument list too long")."""
    if spec.array is None:
        return []
    lines = [json.dumps(p, sort_keys=True) for p in spec.array.parameter_sets()]
    for index, line in enumerate(lines):
        size = len(f"{PARAMS_ENV}={line}".encode()) + 1
        if size > MAX_ARG_STRLEN:
            loc = ("array", "params", index) if spec.array.params else ("array", "grid")
            raise ConfigError(
                format_problems(
                    where,
                    [
                        (
                            loc,
                            (
                                f"parameter set {index} is {size} bytes as ${PARAMS_ENV} (its JSON, the name and a NUL), more than "
                                f"the {MAX_ARG_STRLEN} one environment entry may hold (Linux's MAX_ARG_STRLEN)"
                            ),
                        )
                    ],
                )
            )
    return lines


class Submitter:
    def __init__(self, site: SiteConfig, ledger: Ledger, client: SlurmClient | None = None, user: str | None = None):
        self.site = site
        self.ledger = ledger
        self.client = client or SlurmClient.for_site(site)
        self.user = user or getpass.getuser()

    def _find_tagged(self, tag: str) -> str | None:
        """The Slurm id of this user's job carrying ``tag`` (see JobPaths.submission_tag), if the controller has it."""
        try:
            return self.client.find_by_comment(tag)
        except HpctrainError:
            return None

    def _node_count_lists(self, spec: JobSpec) -> bool:
        """Whether the spec's shapes go to sbatch as a list: only where a range would hold others (`--nodes=2-4` of
        shapes 4 and 2) and the controller reads lists (one `scontrol show config`)."""
        counts = spec.resources.node_counts
        return max(counts) - min(counts) + 1 != len(counts) and self.client.version().has_node_count_lists

    def _chunks(self, spec: JobSpec, params: list[str]) -> list[ArrayChunk | None]:
        if spec.array is None:
            return [None]
        limit = max_array_size(self.site, self.ledger, self.client)
        return list(plan_chunks(len(params), limit, spec.array.throttle))

    def submit(
        self,
        spec: JobSpec,
        where: Path | str,
        dry_run: bool = False,
        sweep_id: str | None = None,
        lineage: dict[str, Any] | None = None,
        on_record: OnRecord | None = None,
        on_files: OnFiles | None = None,
        placement: Placement | None = None,
        race_file: Path | None = None,
        group_id: int | None = None,
    ) -> Submission:
        """Validate everything, then submit one job, or one array per chunk. Throttled chunks run one
        after another (afterany) so the throttle holds across chunks. A dry run writes nothing.
        ``on_record(ledger id, chunk)`` runs in the transaction recording each job, before its sbatch;
        ``on_files(paths)`` once the job directory is made, before the first sbatch. ``placement``: one chosen
        already (`hpctrain.submit.soonest`), else `choose_placement`'s. ``race_file``: one runner of a race
        (hpctrain.runtime.race), recorded in ``group_id``'s group when given (the race's first runner)."""
        params = params_lines(spec, where)
        if placement is None:
            placement = choose_placement(spec, self.site, self.client, self.user, where, self.ledger)
        rendered = self._with_ledger_dependencies(spec, where)
        secret_values = secret_env(spec, where)
        if lineage is None and not dry_run:
            lineage = build_lineage(spec)
        chunks = self._chunks(spec, params)
        lists = self._node_count_lists(spec)
        sub = Submission(placement, [])
        files = JobPaths(self.site.paths.logs / f"{spec.name}-DRYRUN")
        previous: list[str] = []
        # From before the first record until Slurm's answers are recorded (hpctrain.jobs.unsent).
        with nullcontext() if dry_run else submitting(self.ledger):
            for chunk in chunks:
                after = previous if chunk and chunk.throttle else []
                if dry_run:
                    sub.scripts.append(
                        render_script(rendered, self.site, placement, files, "DRYRUN", chunk, after, size_strings=lists)
                    )
                    previous = ["DRYRUN"]
                    continue
                group = group_id if sub.group_id is None else sub.group_id
                job_id = self._record_job(
                    spec, placement, chunk, params, group, sweep_id, lineage, on_record, race_file
                )
                try:
                    if sub.group_id is None:
                        # The ledger id alone is unique only within one ledger; the logs directory is shared.
                        files = JobPaths(self.site.paths.logs / f"{spec.name}-{job_id}-{secrets.token_hex(3)}")
                        self._prepare_dir(files, spec, params, placement)
                        if chunk is not None and len(chunks) > 1 and chunk.throttle:
                            chunk_table.start_table(files, chunk.throttle, spec.dependency.singleton)
                        sub.files = files
                        if on_files is not None:
                            on_files(files)
                    script = render_script(
                        rendered, self.site, placement, files, str(job_id), chunk, after, race_file, lists
                    )
                    sub.scripts.append(script)
                    path = files.script(chunk.index if chunk else 0)
                    path.write_text(script)
                    secret_file.write(files.job_dir, job_id, secret_values)
                    self.ledger.jobs.set_script(
                        job_id, str(path), str(files.job_dir), hashlib.sha256(script.encode()).hexdigest()
                    )
                    previous = [self._sbatch(job_id, script, spec.secret_names(), files.submission_tag(str(job_id)))]
                except Exception as exc:  # not an interrupt: sbatch may have taken the job meanwhile
                    message = str(exc) if isinstance(exc, HpctrainError) else f"{type(exc).__name__}: {exc}"
                    self.ledger.jobs.submit_failed(job_id, message)
                    secret_file.remove(files.job_dir, job_id)
                    self.ledger.event("submit_failed", message, job_id=job_id)
                    raise
                sub.ledger_ids.append(job_id)
                sub.slurm_ids.extend(previous)
                sub.chunks.append(chunk)
                if chunk is not None and len(chunks) > 1 and chunk.throttle:
                    self._add_chunk(files, chunk, previous[0], job_id)
        return sub

    def _add_chunk(self, files: JobPaths, chunk: ArrayChunk, slurm_id: str, job_id: int) -> None:
        """Enter a chunk sbatch took in the submission's chunk table (its throttle holds across chunks); if
        Slurm refuses its early release, it still starts after the chunk before (afterany)."""
        released = (chunk.throttle or 0) if chunk.index == 0 else 0
        try:
            chunk_table.add_chunk(files, chunk_table.Chunk(slurm_id, chunk.offset, chunk.count, released), self.client)
        except (HpctrainError, OSError) as exc:
            self.ledger.event("chunk_release_failed", str(exc), job_id=job_id)

    def _prepare_dir(self, files: JobPaths, spec: JobSpec, params: list[str], placement: Placement) -> None:
        """The job directory: its journal, the spec the job reads, array parameters (`params_lines`), and for
        checkpoints every "auto" steps (either tier) the interruptions of jobs like it (same partition, QOS and GPUs)
        lately."""
        files.journal_dir.mkdir(parents=True, exist_ok=True)
        recorded = spec.redacted()
        write_json_atomic(files.spec_file, recorded)
        write_json_atomic(files.policy_file, RunPolicy.of(recorded).to_json())
        c = spec.checkpoint
        if "auto" in (c.every_steps, c.every_minutes, c.memory_every_steps):
            gpus = spec.resources.nodes * spec.resources.gpus_per_node
            since = time.time() - HISTORY_DAYS * 86400
            seen = self.ledger.attempts.interruptions(self.site.name, placement.partition, placement.qos, gpus, since)
            like = f"partition {placement.partition}, QOS {placement.qos}, {gpus} GPUs, {HISTORY_DAYS} days"
            write_json_atomic(files.interruptions_file, {**seen._asdict(), "like": like})
        if params:
            tmp = files.job_dir / ".params.jsonl.tmp"
            tmp.write_text("".join(line + "\n" for line in params))
            tmp.replace(files.params_file)

    def _with_ledger_dependencies(self, spec: JobSpec, where: Path | str) -> JobSpec:
        """The spec to render: its dependency.after_jobs (ledger ids) added to dependency.after as the Slurm ids of
        every chunk of their submissions."""
        dep = spec.dependency
        if not dep.after_jobs:
            return spec
        slurm_ids = []
        for n, job_id in enumerate(dep.after_jobs):
            row = self.ledger.jobs.get(job_id)
            ids = (
                [
                    r["slurm_job_id"]
                    for r in self.ledger.jobs.in_group(row["group_id"] or row["id"])
                    if r["slurm_job_id"]
                ]
                if row
                else []
            )
            if not ids:
                why = "is not in the ledger" if row is None else f"was never submitted ({row['state']})"
                raise ConfigError(
                    format_problems(where, [(("dependency", "after_jobs", n), f"ledger job {job_id} {why}")])
                )
            slurm_ids += ids
        return spec.model_copy(update={"dependency": dep.model_copy(update={"after": [*dep.after, *slurm_ids]})})

    def _record_job(
        self,
        spec: JobSpec,
        placement: Placement,
        chunk: ArrayChunk | None,
        params: list[str],
        group_id: int | None,
        sweep_id: str | None,
        lineage: dict[str, Any] | None,
        on_record: OnRecord | None,
        race_file: Path | None = None,
    ) -> int:
        with self.ledger.transaction():
            job_id = self.ledger.jobs.record(
                {
                    "name": spec.name,
                    "site": self.site.name,
                    "user": self.user,
                    "account": placement.account,
                    "partition": placement.partition,
                    "qos": placement.qos,
                    "is_array": int(chunk is not None),
                    "spec_json": spec.redacted(),
                    "choice_reason": placement.reason,
                    "sweep_id": sweep_id,
                    "lineage_json": lineage,
                    "group_id": group_id,
                    "param_offset": chunk.offset if chunk else None,
                    "race": str(race_file) if race_file else None,
                },
                tasks=(
                    {"task_index": t, "param_index": chunk.offset + t, "params_json": params[chunk.offset + t]}
                    for t in range(chunk.count)
                )
                if chunk
                else (),
            )
            starts = placement.starts
            self.ledger.event(
                "placement",
                placement.reason,
                job_id=job_id,
                account=placement.account,
                partition=placement.partition,
                qos=placement.qos,
                **({"predicted_start": starts[0], "slurm_start": starts[1]} if starts else {}),
            )
            if on_record is not None:
                on_record(job_id, chunk)
        return job_id

    def _sbatch(self, job_id: int, script: str, secret_names: list[str], tag: str) -> str:
        try:
            # The secrets reach the job through its secrets file: none of them may travel with sbatch.
            slurm_id = self.client.sbatch(script, unset_env=secret_names)
        except HpctrainError as exc:
            # No answer is not no: a busy controller may have taken the job. Submitting it again later
            # would run it twice, so look for it first.
            found = self._find_tagged(tag) if isinstance(exc, SlurmTimeout) else None
            if found is None:
                raise
            slurm_id = found
        self.ledger.jobs.submitted(job_id, slurm_id)
        self.ledger.event("submitted", f"slurm job {slurm_id}", job_id=job_id, slurm_job_id=slurm_id)
        return slurm_id
