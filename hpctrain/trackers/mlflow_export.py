"""`hpctrain export mlflow`: each job's task as one MLflow run (params, metrics with their steps and times, tags with
the ledger's and Slurm's ids, the run's status), evaluation results as metrics by checkpoint step, and the registry
mirrored (`mlflow_registry`).

Safe to kill and to run twice at once. Exports from one ledger to one tracker take turns (`lock`). A run is found
again by its key tag (ledger id, job, task) before one is made, and repaired: missing params and tags, its status.
What a run holds is kept in the run itself: each `log_batch` carries, in the same call, the tag ``hpctrain.seq``,
the last of the ledger's arrivals (`seq`) it holds in full; before sending, the tag ``hpctrain.sending`` names the
last one about to be sent, so that after a kill the values in between are checked against the run's history and
none is logged twice. The ledger keeps each run's id and how far it was sent, to find it without a search.
Names MLflow refuses are mapped (`mlflow_names`); a run MLflow refuses is one line, and the other runs go on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import JobRow
from hpctrain.trackers.lock import export_lock
from hpctrain.trackers.mlflow_names import originals, valid
from hpctrain.trackers.mlflow_registry import mirror_registry
from hpctrain.trackers.mlflow_uri import TrackingUri, reachable
from hpctrain.trackers.runs import Point, Run, points_after, runs_of

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run as MlflowRun

BATCH = 1000  # metrics per log_batch call (MLflow's limit)
PARAMS_BATCH = 100  # params per log_batch call (MLflow's limit)
PARAM_VALUE_MAX = 6000  # characters (MLflow's limit)
KEY_TAG = "hpctrain.key"  # <ledger id>/<job id>/<task index>: finds the run again
SEQ_TAG = "hpctrain.seq"  # the run holds every value that reached the ledger up to this seq
SENDING_TAG = "hpctrain.sending"  # an export was about to send values up to this seq
REFUSED = ("INVALID_PARAMETER_VALUE", "BAD_REQUEST")  # MLflow's error codes for a value it will not take
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
    refused: list[str] = field(default_factory=list)  # "job N[task]: why", a run MLflow would not take


def export_mlflow(ledger: Ledger, jobs: Sequence[JobRow], uri: TrackingUri, experiment: str) -> Sent:
    """Send ``jobs`` (and the registry's versions of them) to the MLflow tracking store at ``uri``."""
    reachable(uri)
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")  # a server gone mid-way: an error, not minutes
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # a line per run, on our stdout
    uri.credentials()
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError  # what a database URI's store raises unwrapped

    sent = Sent()
    with export_lock(ledger, uri.key):
        try:
            client = MlflowClient(tracking_uri=uri.client, registry_uri=uri.client)
            exporter = _Exporter(ledger, client, uri.key, _experiment(client, experiment), sent)
            runs: dict[tuple[int, int], str] = {}
            for job in jobs:
                for run in runs_of(ledger, job):
                    try:
                        runs[run.key] = exporter.send(run)
                    except MlflowException as exc:
                        if exc.error_code not in REFUSED:
                            raise
                        sent.refused.append(f"{run.name} (job {job['id']}): {uri.redact(_first_line(exc))}")
            sent.versions, sent.aliases = mirror_registry(ledger, client, runs)
        except (MlflowException, SQLAlchemyError) as exc:
            raise HpctrainError(f"MLflow at {uri.shown}: {uri.redact(_first_line(exc))}") from None
        except ModuleNotFoundError as exc:  # a database URI whose driver this install lacks
            raise HpctrainError(f"MLflow at {uri.shown}: needs the Python module {exc.name}, not installed") from None
    return sent


def _experiment(client: MlflowClient, name: str) -> str:
    """The id of the experiment ``name``, made if missing (by this export or another at once)."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        try:
            return client.create_experiment(name)
        except MlflowException:
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.lifecycle_stage != "active":
        raise HpctrainError(f"MLflow experiment {name!r} is deleted there: restore it, or give another --experiment")
    return str(found.experiment_id)


@dataclass
class _Exporter:
    ledger: Ledger
    client: MlflowClient
    tracker: str
    experiment_id: str
    sent: Sent

    def send(self, run: Run) -> str:
        """Bring the run's MLflow run up to the ledger; returns its id."""
        from mlflow.entities import Param, RunTag

        job, task = run.job, run.task_index
        key = f"{self.ledger.exports.ledger_id()}/{job['id']}/{task}"
        found = self._find(run, key)
        created = found is None
        if found is None:
            start = job["started_at"] or job["submitted_at"]
            at = None if start is None else _ms(start)
            found = self.client.create_run(self.experiment_id, at, {**run.tags, KEY_TAG: key}, run.name)
            self.sent.runs_created += 1
        run_id, tags, params = found.info.run_id, found.data.tags, found.data.params
        held = int(tags.get(SEQ_TAG) or self._legacy_seq(run, run_id))
        points = points_after(self.ledger, run, held)
        through = points[-1].seq if points else held
        sending = int(tags.get(SENDING_TAG) or 0)
        if sending > held:  # an export was killed mid-way: some may be there already
            points = self._not_held(run_id, points, sending)
        names = {valid(n): n for n in {*run.params, *(p.name for p in points)}}
        fix = [
            RunTag(k, v) for k, v in sorted({**run.tags, KEY_TAG: key, **originals(names)}.items()) if tags.get(k) != v
        ]
        new_params = [
            Param(valid(k), v[:PARAM_VALUE_MAX]) for k, v in sorted(run.params.items()) if valid(k) not in params
        ]
        for some in _chunks(new_params, PARAMS_BATCH):
            self.client.log_batch(run_id, params=some)
        if fix:
            self.client.log_batch(run_id, tags=fix)
        if through > held:
            self._log(run_id, points, through, sending)
        changed = found.info.status != run.status
        if changed:
            if run.status in ("FINISHED", "FAILED", "KILLED"):
                ended = job["ended_at"]
                self.client.set_terminated(run_id, run.status, None if ended is None else _ms(ended))
            else:
                self.client.update_run(run_id, run.status)
        if not created and (points or changed or fix or new_params):
            self.sent.runs_updated += 1
        self.sent.metrics += sum(1 for p in points if not p.evaluation)
        self.sent.evaluations += len({p.seq for p in points if p.evaluation})
        self.ledger.exports.sent(self.tracker, job["id"], task, run_id, through, run.state)
        return run_id

    def _find(self, run: Run, key: str) -> MlflowRun | None:
        """The run made for ``key`` before (the ledger's id for it, else a search by its tag; extra copies that an
        export without the lock made are deleted), or None."""
        from mlflow.exceptions import MlflowException

        known = self.ledger.exports.get(self.tracker, run.job["id"], run.task_index)
        if known is not None:
            try:
                found = self.client.get_run(known["run_id"])
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
            else:
                if (
                    found.info.lifecycle_stage == "active"
                    and found.info.experiment_id == self.experiment_id
                    and found.data.tags.get(KEY_TAG, key) == key
                ):
                    return found
        copies = self.client.search_runs(
            [self.experiment_id], f"tags.`{KEY_TAG}` = '{key}'", order_by=["attributes.start_time ASC"]
        )
        for extra in copies[1:]:
            self.client.delete_run(extra.info.run_id)
        return copies[0] if copies else None

    def _legacy_seq(self, run: Run, run_id: str) -> int:
        """How far a run without SEQ_TAG was sent: by the ledger (a run an earlier hpctrain made), else nothing."""
        known = self.ledger.exports.get(self.tracker, run.job["id"], run.task_index)
        return known["sent_seq"] if known is not None and known["run_id"] == run_id else 0

    def _not_held(self, run_id: str, points: list[Point], upto: int) -> list[Point]:
        """``points`` less those up to seq ``upto`` that the run's history holds already."""
        doubtful = {valid(p.name) for p in points if p.seq <= upto}
        held = {
            (key, m.step, m.timestamp, repr(m.value))
            for key in doubtful
            for m in self.client.get_metric_history(run_id, key)
        }
        return [p for p in points if p.seq > upto or (valid(p.name), p.step, _ms(p.at), repr(p.value)) not in held]

    def _log(self, run_id: str, points: list[Point], through: int, sending: int) -> None:
        """Log ``points`` (in the ledger's order), each batch with the seq it completes, after SENDING_TAG says
        ``through``; the run then holds every value up to ``through``."""
        from mlflow.entities import Metric, RunTag

        if sending < through:
            self.client.set_tag(run_id, SENDING_TAG, str(through))
        if not points:
            self.client.set_tag(run_id, SEQ_TAG, str(through))
        for i in range(0, len(points), BATCH):
            chunk = points[i : i + BATCH]
            rest = points[i + BATCH :]
            complete = through if not rest else chunk[-1].seq - (rest[0].seq == chunk[-1].seq)
            metrics = [Metric(valid(p.name), p.value, _ms(p.at), p.step) for p in chunk]
            self.client.log_batch(run_id, metrics=metrics, tags=[RunTag(SEQ_TAG, str(complete))])


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _ms(at: float) -> int:
    return int(at * 1000)


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def describe(sent: Sent, uri: TrackingUri) -> str:
    return (
        f"MLflow at {uri.shown}: {sent.runs_created} runs created, {sent.runs_updated} updated, {sent.metrics} metric "
        f"values, {sent.evaluations} evaluations, {sent.versions} model versions"
        + (f", aliases moved: {', '.join(sent.aliases)}" if sent.aliases else "")
    )
