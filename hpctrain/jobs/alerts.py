"""Flags on running jobs for `hpctrain status`: stalled (a job that reports steps reported none lately), data-bound (waiting for data),
stragglers (ranks far slower than their pipeline stage's median)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from hpctrain.config.site import Alerts
from hpctrain.jobs.stragglers import latest
from hpctrain.ledger import Ledger

RECENT_STEPS = 20


def job_alerts(
    ledger: Ledger, jobs: Sequence[Mapping[str, Any]], limits: Alerts, now: float | None = None
) -> dict[int, list[str]]:
    """Alerts of each RUNNING job among ``jobs`` (ledger rows or summaries with id and state)."""
    now = now or time.time()
    out: dict[int, list[str]] = {}
    for job in jobs:
        if job["state"] != "RUNNING":
            continue
        found = []
        # Only a job that reports steps has a stall clock (a plain command, an array of evaluations, has none);
        # it restarts with each run.
        if (last := ledger.metrics.last_time(job["id"])) is not None:
            since = max(last, ledger.attempts.last_start(job["id"]) or last)
            if now - since > limits.stall_minutes * 60:
                found.append(
                    f"stalled: no training step for {(now - since) / 60:.0f} min"
                    + ("" if since == last else " (none since the run started)")
                )
        wait = ledger.metrics.data_wait_fraction(job["id"], RECENT_STEPS)
        if wait is not None and wait > limits.data_wait_fraction:
            found.append(f"data-bound: {100 * wait:.0f}% of step time waiting for data (last {RECENT_STEPS} steps)")
        if (slow := latest(ledger, job["id"])) and slow[1]:
            found.append(f"stragglers at step {slow[0]}: {', '.join(map(str, slow[1]))}")
        if found:
            out[job["id"]] = found
    return out
