"""Cancelling a submission (all chunks of it) or a whole sweep: one scancel call, an event per job."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import TERMINAL


def _cancel(ledger: Ledger, client: SlurmClient, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    live = [r for r in rows if r["slurm_job_id"] and r["state"] not in TERMINAL]
    client.scancel([r["slurm_job_id"] for r in live])
    for r in live:
        ledger.event("cancel_requested", f"scancel {r['slurm_job_id']}", job_id=r["id"])
    return [r["slurm_job_id"] for r in live]


def cancel_jobs(ledger: Ledger, client: SlurmClient, job: Mapping[str, Any]) -> list[str]:
    """Cancel every unfinished job of ``job``'s submission; returns the Slurm ids cancelled."""
    return _cancel(ledger, client, ledger.jobs.in_group(job["group_id"]))


def cancel_sweep(ledger: Ledger, client: SlurmClient, sweep_id: str) -> list[str]:
    """Cancel every unfinished job of a sweep and mark it CANCELLED, or the next tick would submit its trials again."""
    rows = ledger.jobs.of_sweep(sweep_id)
    if not rows and ledger.sweeps.get(sweep_id) is None:
        raise HpctrainError(f"sweep {sweep_id!r}: not in the ledger")
    cancelled = _cancel(ledger, client, rows)
    ledger.sweeps.set_state(sweep_id, "CANCELLED")
    return cancelled
