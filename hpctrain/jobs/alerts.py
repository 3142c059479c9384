"""Flags on running jobs for `hpctrain status`: stalled (no training step lately), data-bound (waiting for data)."""

from __future__ import annotations

import time
from typing import Any

from hpctrain.config.site import Alerts
from hpctrain.ledger import Ledger

RECENT_STEPS = 20

_LAST_STEP_SQL = """
SELECT max(m.time) FROM metrics m WHERE m.job_id = :job
"""
_RUN_START_SQL = """
SELECT max(started_at) FROM attempts WHERE job_id = :job
"""
# Mean data wait over mean step time across the latest steps that report both.
_DATA_WAIT_SQL = f"""
SELECT avg(w.value) / avg(s.value) FROM (
    SELECT job_id, task_index, step, value FROM metrics WHERE job_id = :job AND name = 'step_time_s'
    ORDER BY step DESC LIMIT {RECENT_STEPS}) s
JOIN metrics w ON w.job_id = s.job_id AND w.task_index = s.task_index AND w.step = s.step AND w.name = 'data_wait_s'
"""


def job_alerts(ledger: Ledger, jobs: list[dict[str, Any]], limits: Alerts, now: float | None = None) -> dict[int, list[str]]:
    """Alerts of each RUNNING job among ``jobs`` (ledger rows or summaries with id and state)."""
    now = now or time.time()
    out: dict[int, list[str]] = {}
    for job in jobs:
        if job["state"] != "RUNNING":
            continue
        found = []
        last = ledger.db.execute(_LAST_STEP_SQL, {"job": job["id"]}).fetchone()[0]
        since = last or ledger.db.execute(_RUN_START_SQL, {"job": job["id"]}).fetchone()[0]
        if since is not None and now - since > limits.stall_minutes * 60:
            found.append(f"stalled: no training step for {(now - since) / 60:.0f} min"
                         + ("" if last else " (none since the run started)"))
        wait = ledger.db.execute(_DATA_WAIT_SQL, {"job": job["id"]}).fetchone()[0]
        if wait is not None and wait > limits.data_wait_fraction:
            found.append(f"data-bound: {100 * wait:.0f}% of step time waiting for data (last {RECENT_STEPS} steps)")
        if found:
            out[job["id"]] = found
    return out
