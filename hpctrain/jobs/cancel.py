"""Cancelling a submission (all chunks of it), a whole sweep, or the losers of a race (`submit --race`): one scancel
call, an event per job."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import JobRow, SubmittedJob
from hpctrain.runtime.race import won
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import TERMINAL


def _cancel(ledger: Ledger, client: SlurmClient, rows: Sequence[Mapping[str, Any]]) -> list[str]:
    live = [r for r in rows if r["slurm_job_id"] and r["state"] not in TERMINAL]
    client.scancel([r["slurm_job_id"] for r in live])
    for r in live:
        ledger.event("cancel_requested", f"scancel {r['slurm_job_id']}", job_id=r["id"])
    return [r["slurm_job_id"] for r in live]


def cancel_jobs(ledger: Ledger, client_of: Callable[[str], SlurmClient], job: Mapping[str, Any]) -> list[str]:
    """Cancel every unfinished job of ``job``'s submission, each on its own cluster (``client_of`` its site: the
    runners of a race may be on several); returns the Slurm ids cancelled."""
    by_site: dict[str, list[JobRow]] = {}
    for row in ledger.jobs.in_group(job["group_id"]):
        by_site.setdefault(row["site"], []).append(row)
    return [i for site, rows in by_site.items() for i in _cancel(ledger, client_of(site), rows)]


def cancel_sweep(ledger: Ledger, client: SlurmClient, sweep_id: str) -> list[str]:
    """Cancel every unfinished job of a sweep and mark it CANCELLED, or the next tick would submit its trials again."""
    rows = ledger.jobs.of_sweep(sweep_id)
    if not rows and ledger.sweeps.get(sweep_id) is None:
        raise HpctrainError(f"sweep {sweep_id!r}: not in the ledger")
    cancelled = _cancel(ledger, client, rows)
    ledger.sweeps.set_state(sweep_id, "CANCELLED")
    return cancelled


def cancel_race_losers(ledger: Ledger, client: SlurmClient, site: str) -> list[str]:
    """Cancel each runner of a race other than the one that claimed it (hpctrain.runtime.race); the Slurm ids. A
    race nobody has claimed yet is left alone: a runner the ledger still has pending may have started already."""
    by_race: dict[str, list[SubmittedJob]] = {}
    for row in ledger.jobs.racing(site):
        by_race.setdefault(row["race"] or "", []).append(row)
    losers = []
    for race, rows in by_race.items():
        try:
            winner = Path(race).read_text().strip()
        except OSError:
            continue  # not claimed yet (or its file system is away: the runners decide among themselves)
        losers += [
            r for r in rows if winner and not won(winner, r["id"], r["slurm_job_id"]) and r["state"] not in TERMINAL
        ]
    if not losers:
        return []
    client.scancel([r["slurm_job_id"] for r in losers])
    for r in losers:
        ledger.event(
            "race_lost", f"scancel {r['slurm_job_id']}: another placement of its race started first", job_id=r["id"]
        )
    return [r["slurm_job_id"] for r in losers]
