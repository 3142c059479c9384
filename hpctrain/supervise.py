"""Requeue runs that died without a word (killed batch shell, OOM kill, node failure without requeue).

A run that ends normally decides for itself in its batch script (`hpctrain attempt end`); one that
could not leaves its last attempt undecided in the ledger. `hpctrain reconcile` then applies the
same policy from the login node: `scontrol requeue` while Slurm still holds the job, else (a plain
job) a fresh sbatch of the same script under a new Slurm id, its attempts numbered on.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import ATTEMPT_BASE_ENV
from hpctrain.runtime.attempts import Outcome, checkpoint_dir, decide, fill_end_steps, latest_committed_step
from hpctrain.slurm.client import SlurmClient
from hpctrain.status import TERMINAL, array_state
from hpctrain.submit import secret_file

# Final states in which Slurm does not run the job again by itself.
DIED = ("FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "PREEMPTED", "DEADLINE")

_UNDECIDED_SQL = f"""
SELECT j.id AS job_id, -1 AS task_index FROM jobs j
WHERE j.site = :site AND j.is_array = 0 AND j.state IN ({",".join(f"'{s}'" for s in DIED)})
UNION ALL
SELECT j.id, t.task_index FROM jobs j JOIN array_tasks t ON t.job_id = j.id
WHERE j.site = :site AND t.state IN ({",".join(f"'{s}'" for s in DIED)})
"""

# Array tasks that may still run: not ended, or dead with their last attempt undecided.
_UNSETTLED_TASKS_SQL = f"""
SELECT count(*) FROM array_tasks t WHERE t.job_id = ? AND (t.state NOT IN ({",".join(f"'{s}'" for s in TERMINAL)})
  OR (t.state IN ({",".join(f"'{s}'" for s in DIED)}) AND (SELECT a.requeued FROM attempts a
      WHERE a.job_id = t.job_id AND a.task_index = t.task_index ORDER BY a.attempt DESC LIMIT 1) IS NULL))
"""


@dataclass
class Decision:
    job_id: int
    task_index: int
    requeued: bool
    why: str


def supervise(ledger: Ledger, client: SlurmClient, site: str) -> list[Decision]:
    """Decide every dead run whose last attempt nobody has decided on yet; returns what was done."""
    decisions = []
    for row in ledger.db.query(_UNDECIDED_SQL, {"site": site}):
        attempts = ledger.rows("attempts", "job_id = ? AND task_index = ?", [row["job_id"], row["task_index"]],
                               order_by="attempt")
        if attempts and attempts[-1]["requeued"] is None:
            decisions.append(_decide(ledger, client, ledger.get("jobs", row["job_id"]), row["task_index"], attempts))
    return decisions


def _decide(ledger: Ledger, client: SlurmClient, job: dict[str, Any], task: int, attempts: list[dict[str, Any]]) -> Decision:
    spec = json.loads(job["spec_json"] or "{}")
    retry = spec.get("retry") or {}
    outcomes = fill_end_steps([Outcome(a["cause"], a["step_start"], a["step_end"]) for a in attempts],
                              latest_committed_step(checkpoint_dir(spec, task)))
    go, why = decide(outcomes, spec.get("requeue", True), retry.get("on_error", False),
                     retry.get("max_stalled_attempts", 3))
    if go:
        try:
            why = f"{why} by reconcile: {_run_again(ledger, client, job, task, len(attempts))}"
        except HpctrainError as exc:  # Slurm down, a secret missing: left undecided, the next reconcile tries again
            return Decision(job["id"], task, False, f"requeue failed, will retry: {exc}")
    last = attempts[-1]
    with ledger.transaction():
        ledger.upsert("attempts", {"job_id": job["id"], "task_index": task, "attempt": last["attempt"],
                                   "step_end": outcomes[-1].step_end, "requeued": int(go), "decision": why},
                      pk=("job_id", "task_index", "attempt"))
        if go:
            _mark_requeued(ledger, job, task)
        ledger.event("requeue" if go else "stopped", why, job_id=job["id"], task_index=task, attempt=last["attempt"],
                     cause=last["cause"])
    if not go and (task < 0 or not ledger.db.execute(_UNSETTLED_TASKS_SQL, [job["id"]]).fetchone()[0]):
        secret_file.remove(job["job_dir"], job["id"])  # the job will not run again
    return Decision(job["id"], task, go, why)


def _run_again(ledger: Ledger, client: SlurmClient, job: dict[str, Any], task: int, attempts: int) -> str:
    target = job["slurm_job_id"] + (f"_{task}" if task >= 0 else "")
    secret_names = _keep_secrets_file(job, target)
    try:
        client.requeue(target)
        return f"scontrol requeue {target}"
    except HpctrainError as exc:
        if "invalid job id" not in str(exc).lower() or task >= 0:
            raise
    # Slurm has forgotten the job (past MinJobAge): the same script again, under a new id.
    new_id = client.sbatch(Path(job["script_path"]).read_text(), env={ATTEMPT_BASE_ENV: str(attempts)},
                           unset_env=secret_names)
    ledger.update("jobs", job["id"], {"slurm_job_id": new_id, "attempt_base": attempts})
    return f"Slurm no longer held job {target}: resubmitted as {new_id}"


def _keep_secrets_file(job: dict[str, Any], target: str) -> list[str]:
    """The job's secret names, its secrets file there for the next run: the one written at submit, else
    one written now from this environment."""
    names = secret_file.names(json.loads(job["spec_json"] or "{}"))
    if not names or secret_file.path(job["job_dir"], job["id"]).exists():
        return names
    missing = sorted(k for k in names if os.environ.get(k) is None)
    if missing:
        raise HpctrainError(f"job {target} has no secrets file left, and running it again needs the secret(s) "
                            f"{', '.join(missing)} in this environment")
    secret_file.write(job["job_dir"], job["id"], {k: os.environ[k] for k in names})
    return names


def _mark_requeued(ledger: Ledger, job: dict[str, Any], task: int) -> None:
    """Active again, so the next poll follows it (its old run may still be sacct's last for a moment)."""
    now = time.time()
    if task < 0:
        ledger.update("jobs", job["id"], {"state": "REQUEUED", "ended_at": None, "updated_at": now})
        return
    ledger.db.execute("UPDATE array_tasks SET state = 'REQUEUED', updated_at = ? WHERE job_id = ? AND task_index = ?",
                      [now, job["id"], task])
    states = [r["state"] for r in ledger.rows("array_tasks", "job_id = ?", [job["id"]])]
    ledger.update("jobs", job["id"], {"state": array_state(states), "ended_at": None, "updated_at": now})
