"""`hpctrain export mlflow`: each job's task as one MLflow run (params, metrics with their steps and times, tags with
the ledger's and Slurm's ids, the run's status), evaluation results as metrics by checkpoint step, and the registry's
versions and aliases mirrored into MLflow's model registry.

Idempotent: the ledger keeps, per tracking URI and task, the run it made and the last metric row and evaluation it
sent (`ledger.exports`); a second export sends nothing, a later one what is new. A run that MLflow lost (a new store)
is made again. Metrics go by `log_batch`, 1,000 at a time, MLflow's own limit.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import JobRow
from hpctrain.trackers.runs import Run, evaluations_after, runs_of

if TYPE_CHECKING:
    from mlflow import MlflowClient

BATCH = 1000  # metrics per log_batch call (MLflow's limit)
PARAMS_BATCH = 100  # params per log_batch call (MLflow's limit)
PARAM_VALUE_MAX = 6000  # characters (MLflow's limit)
VERSION_TAG = "hpctrain.version"
T = TypeVar("T")


@dataclass
class Sent:
    """What one export sent."""

    runs_created: int = 0
    runs_updated: int = 0
    metrics: int = 0
    evaluations: int = 0
    versions: int = 0
    aliases: list[str] = field(default_factory=list)


def default_uri(ledger_path: Path) -> str:
    """$MLFLOW_TRACKING_URI, else a SQLite file beside the ledger (MLflow's own default is a SQLite file too)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ledger_path.parent.resolve() / 'mlflow.db'}"


def reachable(uri: str, timeout_s: float = 10.0) -> None:
    """Refuse, in one line, a tracking server that does not answer its health check (before anything is sent)."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s) as answer:
            answer.read()
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise HpctrainError(f"MLflow tracking server {uri}: unreachable ({reason}); nothing was exported") from None


def export_mlflow(ledger: Ledger, jobs: Sequence[JobRow], uri: str, experiment: str) -> Sent:
    """Send ``jobs`` (and the registry's versions of them) to the MLflow tracking store at ``uri``."""
    reachable(uri)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # a server gone mid-way: an error, not minutes
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # a line per run, on our stdout
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    sent = Sent()
    try:
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        runs: dict[tuple[int, int], str] = {}
        for job in jobs:
            for run in runs_of(ledger, job):
                runs[run.key] = _send_run(ledger, client, f"mlflow:{uri}", experiment_id, run, sent)
        _mirror_registry(ledger, client, runs, sent)
    except MlflowException as exc:
        raise HpctrainError(f"MLflow at {uri}: {str(exc).splitlines()[0]}") from None
    return sent


def _send_run(ledger: Ledger, client: MlflowClient, tracker: str, experiment_id: str, run: Run, sent: Sent) -> str:
    from mlflow.entities import Metric, Param
    from mlflow.exceptions import MlflowException

    job, task = run.job, run.task_index
    known = ledger.exports.get(tracker, job["id"], task)
    if known is not None:
        try:
            client.get_run(known["run_id"])
        except MlflowException:  # the store was reset or the run deleted: send it all again
            ledger.exports.forget(tracker, job["id"], task)
            known = None
    if known is None:
        start = job["started_at"] or job["submitted_at"]
        run_id = client.create_run(experiment_id, _ms(start), run.tags, run.name).info.run_id
        params = [Param(k, v[:PARAM_VALUE_MAX]) for k, v in sorted(run.params.items())]
        for some_params in _chunks(params, PARAMS_BATCH):
            client.log_batch(run_id, params=some_params)
        sent.runs_created += 1
        rowid, evaluated_at, state = 0, 0.0, None
    else:
        run_id, rowid, evaluated_at, state = (
            known["run_id"],
            known["metrics_rowid"],
            known["evaluations_at"],
            known["state"],
        )
    new = ledger.metrics.after(job["id"], task, rowid)
    points = [Metric(name, value, _ms(at or job["submitted_at"]) or 0, step) for _, name, step, value, at in new]
    evaluations = evaluations_after(ledger, run, evaluated_at)
    points += [
        Metric(f"{evaluator}/{name}", float(value), _ms(at) or 0, step)
        for step, evaluator, values, at in evaluations
        for name, value in values.items()
        if isinstance(value, (int, float))
    ]
    for chunk in _chunks(points, BATCH):
        client.log_batch(run_id, metrics=chunk)
    if run.state != state:
        if run.status in ("FINISHED", "FAILED", "KILLED"):
            client.set_terminated(run_id, run.status, _ms(job["ended_at"]))
        else:
            client.update_run(run_id, run.status)
    if known is not None and (new or evaluations or run.state != state):
        sent.runs_updated += 1
    sent.metrics += len(new)
    sent.evaluations += len(evaluations)
    ledger.exports.sent(
        tracker,
        job["id"],
        task,
        run_id,
        new[-1][0] if new else rowid,
        evaluations[-1][3] if evaluations else evaluated_at,
        run.state,
    )
    return run_id


def _mirror_registry(ledger: Ledger, client: MlflowClient, runs: dict[tuple[int, int], str], sent: Sent) -> None:
    """The registry's versions whose runs this export holds, as MLflow model versions (sourced from those runs),
    and every alias of those models pointing where hpctrain's points."""
    from mlflow.exceptions import MlflowException

    for model in ledger.registry.models():
        name = model["name"]
        versions = [v for v in ledger.registry.versions(name) if (v["job_id"], v["task_index"]) in runs]
        if not versions:
            continue
        try:
            mirrored = client.get_registered_model(name)
        except MlflowException:
            mirrored = client.create_registered_model(name, tags={"hpctrain.gate_metric": model["gate_metric"]})
        have = {
            int(mv.tags[VERSION_TAG]): mv.version
            for mv in client.search_model_versions(f"name = '{name}'")
            if VERSION_TAG in mv.tags
        }
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
            sent.versions += 1
        wanted = {a["alias"]: have[a["version"]] for a in ledger.registry.aliases(name) if a["version"] in have}
        for alias in set(mirrored.aliases) - set(wanted):
            client.delete_registered_model_alias(name, alias)
        for alias, version in wanted.items():
            if str(mirrored.aliases.get(alias)) != str(version):
                client.set_registered_model_alias(name, alias, str(version))
                sent.aliases.append(f"{name}@{alias}")


def _ms(at: float | None) -> int | None:
    return None if at is None else int(at * 1000)


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def describe(sent: Sent, uri: str) -> str:
    return (
        f"MLflow at {uri}: {sent.runs_created} runs created, {sent.runs_updated} updated, {sent.metrics} metric "
        f"values, {sent.evaluations} evaluations, {sent.versions} model versions"
        + (f", aliases moved: {', '.join(sent.aliases)}" if sent.aliases else "")
    )
