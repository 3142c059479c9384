"""Flags on running jobs for `hpctrain status`: a resume that will not be bitwise (its trainer said so), stalled (a
job that reports steps reported none lately), data-bound (waiting for data), stragglers (ranks far slower than
their pipeline stage's median), slow saves (the checkpoint file system slowed down), work at risk (long since the
newest committed checkpoint), idle GPUs (under the job's [idle] below_percent for its alert_minutes) and low GPU use
(under [alerts] gpu_low_percent on average over gpu_low_minutes)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpctrain.config.site import Alerts
from hpctrain.contract import RESUME_NOT_BITWISE
from hpctrain.jobs.gpus import idle_words, uses_of
from hpctrain.jobs.shard_cache import cache_counts, cold_words
from hpctrain.jobs.stragglers import Straggler, latest_of
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import CheckpointRow, LoggedEvent

RECENT_STEPS = 20
SAVES_COMPARED = 10  # the newest checkpoint against the median of this many before it


def job_alerts(
    ledger: Ledger, jobs: Sequence[Mapping[str, Any]], limits: Alerts, now: float | None = None
) -> dict[int, list[str]]:
    """Alerts of each RUNNING job among ``jobs`` (ledger rows or summaries with id and state): a few statements
    for all of them, whatever their number."""
    now = now or time.time()
    ids = [job["id"] for job in jobs if job["state"] == "RUNNING"]
    with ledger.reading():
        facts = _Facts(
            inexact=ledger.events.last_of(ids, RESUME_NOT_BITWISE),
            started=ledger.attempts.last_starts(ids),
            last_step=ledger.metrics.last_times(ids),
            data_wait=ledger.metrics.data_wait_fractions(ids, RECENT_STEPS),
            slow=latest_of(ledger, ids),
            saves=ledger.checkpoints.newest_of(ids, SAVES_COMPARED + 1),
        )
        found = {job_id: _alerts(ledger, job_id, facts, limits, now) for job_id in ids}
        uses = uses_of(ledger, ids)
        window = limits.gpu_low_minutes * 60
        recent = ledger.gpus.recent(ids, now - window)
    for job_id, use in uses.items():  # GPUs held idle now, some of the job's or all of them (issue 61)
        if said := idle_words(use, use.alerting):
            found[job_id].append(f"idle GPUs: {said}")
        # Low on average over the whole window (the timeline's minutes start at most a minute into it).
        elif (low := recent.get(job_id)) and low[0] < limits.gpu_low_percent and low[1] <= now - window + 120:
            found[job_id].append(
                f"low GPU use: {low[0]:.0f} % on average over the last {limits.gpu_low_minutes:g} min"
                + (" (cpu: the ranks' processes)" if use.kind == "cpu" else "")
            )
    return {job_id: said for job_id, said in found.items() if said}


@dataclass(frozen=True)
class _Facts:
    """What the alerts read of the running jobs, by job id (a job without the fact is absent)."""

    inexact: dict[int, LoggedEvent]  # its latest resume-not-bitwise notice
    started: dict[int, float]  # its latest run's start
    last_step: dict[int, float]  # its latest metric
    data_wait: dict[int, float]  # over its last RECENT_STEPS steps
    slow: dict[int, tuple[int, list[Straggler]]]  # its latest ranks record's step and stragglers
    saves: dict[int, list[CheckpointRow]]  # its SAVES_COMPARED + 1 newest checkpoints


def _alerts(ledger: Ledger, job_id: int, facts: _Facts, limits: Alerts, now: float) -> list[str]:
    """The alerts of one running job but its GPU use's (a read of the ledger only if it is data-bound)."""
    found = []
    if (inexact := facts.inexact.get(job_id)) and (said := inexact["message"]):
        found.append(said)
    started = facts.started.get(job_id)  # this run's start
    # Only a job that reports steps has a stall clock (a plain command, an array of evaluations, has none);
    # it restarts with each run.
    if (last := facts.last_step.get(job_id)) is not None:
        since = max(last, started or last)
        if now - since > limits.stall_minutes * 60:
            found.append(
                f"stalled: no training step for {(now - since) / 60:.0f} min"
                + ("" if since == last else " (none since the run started)")
            )
    if (wait := facts.data_wait.get(job_id)) is not None and wait > limits.data_wait_fraction:
        found.append(
            f"data-bound: {100 * wait:.0f}% of step time waiting for data (last {RECENT_STEPS} steps)"
            + cold_words(cache_counts(ledger, job_id))  # is its node cache cold?
        )
    if (slow := facts.slow.get(job_id)) and slow[1]:
        found.append(f"stragglers at step {slow[0]}: {', '.join(map(str, slow[1]))}")
    found += checkpoint_alerts(facts.saves.get(job_id, []), limits, now, started)
    return found


def checkpoint_alerts(saves: list[CheckpointRow], limits: Alerts, now: float, started: float | None) -> list[str]:
    """A slow newest save (``slow_save_factor`` times the median of the ones before), and work at risk: training
    since the newest committed checkpoint (or this run's start, ``started``, when later) past
    ``work_at_risk_minutes``. ``saves``: the job's newest checkpoints, newest first; a job without has neither."""
    if not saves:
        return []
    found = []
    durations = [s["duration_s"] for s in saves if s["duration_s"] is not None]
    if len(durations) >= 4 and (usual := statistics.median(durations[1:])) > 0:
        if durations[0] > limits.slow_save_factor * usual:
            found.append(
                f"slow saves: step {saves[0]['step']}'s checkpoint took {durations[0]:.1f} s, "
                f"{durations[0] / usual:.0f}x the median of the {len(durations) - 1} before ({usual:.1f} s)"
            )
    since = max(saves[0]["created_at"], started or 0.0)
    if now - since > limits.work_at_risk_minutes * 60:
        found.append(f"work at risk: {(now - since) / 60:.0f} min since the newest committed checkpoint")
    return found
