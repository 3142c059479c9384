"""Runs side by side, read from the ledger: what differs between them (hyperparameters, an array task's or a
trial's parameters, seed, layout, code commit and dirty flag, data index digest, package versions) and what
they reached (each metric's final and best value), with their steps, GPU-hours, goodput, GPU utilization,
attempts and preemptions. A run is a plain job or one array task (a sweep's trial is one); `hpctrain compare` prints it,
`compare_page` draws it.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from hpctrain.contract import EVAL_LOSS
from hpctrain.errors import HpctrainError
from hpctrain.jobs.accounting import Usage, usage
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import EvaluationRow, JobRow, MetricSummary
from hpctrain.submit.lineage import flatten

DEFAULT_METRICS = ("loss", EVAL_LOSS)
# Lineage entries a comparison shows (the others, such as the spec's hash, differ whenever any of these do).
SETTINGS = ("hyperparameters", "seed", "parallel", "code", "data", "versions")


@dataclass(frozen=True)
class RunRef:
    """Which run: a job's array task (-1: a plain job), how to call it, and its parameters (a task's, a trial's)."""

    job_id: int
    task_index: int
    label: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    label: str
    job_id: int
    task_index: int
    name: str
    state: str
    settings: dict[str, Any]
    results: dict[str, MetricSummary]
    steps: int | None
    gpu_hours: float
    goodput: float | None
    attempts: int
    preemptions: int
    gpu_util: float | None = None  # mean percent over its GPUs and runs, as the nodes' samplers read them
    source_bytes: float | None = None  # read from the shards' sources by its rank 0 loader through the node's cache


@dataclass
class Comparison:
    runs: list[Run]
    metrics: dict[str, bool]  # name -> lower is better

    @property
    def differing(self) -> list[str]:
        """The settings whose values are not the same in every run, in order."""
        keys = sorted({k for r in self.runs for k in r.settings})
        return [k for k in keys if len({json.dumps(r.settings.get(k)) for r in self.runs}) > 1]

    @property
    def same(self) -> dict[str, Any]:
        differing = set(self.differing)
        return {k: v for k, v in sorted(self.runs[0].settings.items()) if k not in differing} if self.runs else {}

    def settings_table(self) -> tuple[list[str], list[list[Any]]]:
        """(columns, rows): each run's value of each differing setting."""
        keys = self.differing
        return ["run", *keys], [[r.label, *(r.settings.get(k, "-") for k in keys)] for r in self.runs]

    def results_table(self) -> tuple[list[str], list[list[Any]]]:
        """(columns, rows): each run's final and best value ("2.31 @ 400") of each metric, steps, GPU-hours, goodput,
        GPU utilization, the MB read from the shards' sources through the node's cache, attempts and preemptions."""
        metrics = list(self.metrics)
        columns = ["run", "name", "state", *(f"{m} {what}" for m in metrics for what in ("final", "best"))]
        rows = []
        for r in self.runs:
            cells: list[Any] = [r.label, r.name, r.state]
            for m in metrics:
                found = r.results.get(m)
                cells += (
                    [f"{found['last']:.4g} @ {found['last_step']}", f"{found['best']:.4g} @ {found['best_step']}"]
                    if found
                    else ["-", "-"]
                )
            goodput = "-" if r.goodput is None else f"{100 * r.goodput:.1f}%"
            util = "-" if r.gpu_util is None else f"{r.gpu_util:.0f}%"
            source = "-" if r.source_bytes is None else f"{r.source_bytes / 1e6:.0f}"
            rows.append(
                [*cells, r.steps or "-", f"{r.gpu_hours:.2f}", goodput, util, source, r.attempts, r.preemptions]
            )
        columns += ["steps", "GPU-hours", "goodput", "GPU util", "source MB", "attempts", "preemptions"]
        return columns, rows

    def to_json(self) -> dict[str, Any]:
        """What `hpctrain compare --json` prints."""
        return {
            "metrics": {name: "min" if low else "max" for name, low in self.metrics.items()},
            "differing": self.differing,
            "runs": [asdict(r) for r in self.runs],
        }


def parse_metrics(specs: Iterable[str], evaluators: Collection[str] = ()) -> dict[str, bool]:
    """``NAME``, ``NAME@max`` (higher is better) or ``NAME@min`` (the default) -> {name: lower is better}; a NAME is a
    training metric or an evaluation job's EVALUATOR:METRIC, and may hold '@' ("acc@1"). The older ``NAME:max`` and
    ``NAME:min`` are read as a direction too, unless NAME is one of ``evaluators`` (it could as well be that
    evaluator's metric "max": refused)."""
    found = {}
    for spec in specs:
        name, mode = spec, "min"
        if spec.endswith(("@min", "@max", ":min", ":max")):
            name, mode = spec[:-4], spec[-3:]
            if spec[-4] == ":" and name in evaluators:
                raise HpctrainError(
                    f"--metric {spec!r} is ambiguous: write {name}@{mode} for the metric {name!r}, or "
                    f"{spec}@min (or @max) for evaluator {name!r}'s metric {mode!r}"
                )
        if not name:
            raise HpctrainError(f"--metric {spec!r}: expected NAME, NAME@min or NAME@max")
        found[name] = mode == "min"
    return found


def evaluators_of(ledger: Ledger, refs: Iterable[RunRef]) -> set[str]:
    """The evaluators whose evaluation jobs ran on these runs' checkpoints."""
    return {e["evaluator"] for job_id in {r.job_id for r in refs} for e in ledger.evaluations.of_job(job_id)}


def runs_of_jobs(ledger: Ledger, job_ids: Iterable[int]) -> list[RunRef]:
    """Each job, or each task of an array job, labelled by its ledger id ("12", "13.4")."""
    refs = []
    for job_id in job_ids:
        job = ledger.jobs.get(job_id)
        if job is None:
            raise HpctrainError(f"job {job_id}: no such ledger id (see `hpctrain status --all`)")
        if not job["is_array"]:
            refs.append(RunRef(job_id, -1, str(job_id)))
            continue
        for task in ledger.jobs.tasks(job_id):
            params = json.loads(task["params_json"])
            refs.append(RunRef(job_id, task["task_index"], f"{job_id}.{task['task_index']}", params))
    return refs


def runs_of_sweep(ledger: Ledger, sweep_id: str) -> tuple[list[RunRef], dict[str, bool]]:
    """A sweep's trials that ran (labelled "trial N"), and its metric with its direction."""
    from hpctrain.sweep import store

    sweep = store.load(ledger, sweep_id)
    refs = [
        RunRef(t["job_id"], t["task_index"], f"trial {t['number']}", json.loads(t["params_json"]))
        for t in ledger.sweeps.trials_with_tasks(sweep_id)
        if t["job_id"] is not None and t["task_index"] is not None
    ]
    return refs, {sweep.spec.metric: sweep.spec.direction == "minimize"}


SOURCE_BYTES = ("cache_source_bytes",)  # a run's loader's count (hpctrain.data.cache), its newest


def compare_runs(ledger: Ledger, refs: list[RunRef], metrics: Mapping[str, bool]) -> Comparison:
    """The runs ``refs`` side by side, with ``metrics`` (name -> lower is better) summarised; each job's GPU time
    is its own cluster's (the runs may span the sites of one ledger)."""
    if not refs:
        raise HpctrainError("no runs to compare: name ledger job ids, or a sweep whose trials have run")
    jobs: dict[int, JobRow] = {r.job_id: ledger.jobs.known(r.job_id) for r in refs}
    spent = _usage_by_run(ledger, jobs)
    tries = _attempts_by_run(ledger, jobs)
    util = ledger.gpus.means(jobs)
    runs = []
    evaluations = {job_id: ledger.evaluations.of_job(job_id) for job_id in jobs}
    for ref in refs:
        job = jobs[ref.job_id]
        key = (ref.job_id, ref.task_index)
        results = {
            **evaluated(evaluations[ref.job_id], ref.task_index, metrics),
            **ledger.metrics.summary(ref.job_id, ref.task_index, metrics),  # a training metric of the name first
        }
        runs.append(
            Run(
                label=ref.label,
                job_id=ref.job_id,
                task_index=ref.task_index,
                name=job["name"],
                state=ledger.jobs.task_states(ref.job_id).get(ref.task_index, job["state"])
                if ref.task_index >= 0
                else job["state"],
                settings=settings(job, ref.params),
                results=results,
                steps=max((r["last_step"] for r in results.values()), default=None),
                gpu_hours=spent[key][0],
                goodput=spent[key][1],
                attempts=tries[key][0],
                preemptions=tries[key][1],
                gpu_util=util.get(key),
                source_bytes=ledger.metrics.last_values(ref.job_id, SOURCE_BYTES, ref.task_index).get(SOURCE_BYTES[0]),
            )
        )
    return Comparison(runs, dict(metrics))


def evaluation_points(
    rows: Iterable[EvaluationRow], task_index: int, names: Collection[str]
) -> dict[str, list[tuple[int, float]]]:
    """The (step, value) points, by step, of the EVALUATOR:METRIC ``names`` in a task's evaluation results: one per
    evaluated checkpoint."""
    points: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for row in rows:
        if row["task_index"] != task_index or not row["metrics_json"]:
            continue
        for metric, value in json.loads(row["metrics_json"]).items():
            name = f"{row['evaluator']}:{metric}"
            if name in names and isinstance(value, (int, float)) and not math.isnan(value):
                points[name].append((row["step"], float(value)))
    return {name: sorted(found) for name, found in points.items()}


def evaluated(rows: Iterable[EvaluationRow], task_index: int, metrics: Mapping[str, bool]) -> dict[str, MetricSummary]:
    """Summaries of the EVALUATOR:METRIC names among ``metrics`` (name -> lower is better) from a task's evaluation
    results, as `Metrics.summary` gives training metrics'."""
    found: dict[str, MetricSummary] = {}
    for name, steps in evaluation_points(rows, task_index, metrics).items():
        best_step, best = (min if metrics[name] else max)(steps, key=lambda p: p[1])
        found[name] = {
            "last_step": steps[-1][0],
            "last": steps[-1][1],
            "best_step": best_step,
            "best": best,
            "points": len(steps),
        }
    return found


def settings(job: JobRow, params: Mapping[str, Any]) -> dict[str, Any]:
    """A run's settings as flat keys ("hyperparameters.lr", "code.commit", "params.x"), from its job's lineage."""
    lineage = json.loads(job["lineage_json"] or "{}")
    flat = flatten({k: lineage[k] for k in SETTINGS if k in lineage})
    flat.update(flatten(dict(params), "params") if params else {})
    return {k: v for k, v in flat.items() if k}


def _usage_by_run(ledger: Ledger, jobs: Mapping[int, JobRow]) -> dict[tuple[int, int], tuple[float, float | None]]:
    """(GPU-hours, goodput) per run, each on its job's site (no prices: the comparison shows no cost)."""
    runs: dict[tuple[int, int], list[Usage]] = defaultdict(list)
    for job_id, job in jobs.items():
        for u in usage(ledger, job["site"], {}, job_id=job_id):
            runs[(u.job_id, u.task_index)].append(u)
    out: dict[tuple[int, int], tuple[float, float | None]] = defaultdict(lambda: (0.0, None))
    for key, found in runs.items():
        measured = sum(u.gpu_hours for u in found if u.measured)
        productive = sum(u.causes.get("productive", 0.0) for u in found if u.measured)
        out[key] = (sum(u.gpu_hours for u in found), productive / measured if measured else None)
    return out


def _attempts_by_run(ledger: Ledger, jobs: Mapping[int, JobRow]) -> dict[tuple[int, int], tuple[int, int]]:
    """(attempts, preemptions) per run."""
    out: dict[tuple[int, int], tuple[int, int]] = defaultdict(lambda: (0, 0))
    for job_id in jobs:
        for a in ledger.attempts.of_job(job_id):
            key = (job_id, a["task_index"])
            count, preempted = out[key]
            out[key] = (count + 1, preempted + (a["cause"] == "preemption"))
    return out
