"""`hpctrain reconcile`: fold what compute nodes wrote (journals) and what Slurm knows (sacct) into the ledger.

Run by hand or from cron on the login node; safe to run concurrently and repeatedly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from hpctrain.contract import JobPaths
from hpctrain.jobs.accounting import SETTLE_BATCH, settle
from hpctrain.jobs.poll import Poller
from hpctrain.jobs.supervise import Decision, supervise
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.jobs import JOURNALS_READ_S
from hpctrain.ledger.journal import Journal
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import TERMINAL


@dataclass
class ReconcileResult:
    changed_jobs: int
    journals: int
    records: int
    decisions: list[Decision]
    warning: str | None = None  # accounting (sacct) down: states came from squeue


def reconcile(ledger: Ledger, client: SlurmClient, site: str, supervise_runs: bool = True) -> ReconcileResult:
    """One sacct call for every active job, every journal of active or recently ended jobs, then (unless
    ``supervise_runs`` is off, as for `status`) a decision for each run that died without making one."""
    poller = Poller(ledger, client, site)
    changed = poller.refresh()
    now = time.time()
    dirs = ledger.jobs.journals_to_read(site, TERMINAL, now - JOURNALS_READ_S)
    records = sum(ingest_journal(ledger, Journal(JobPaths(Path(d)).journal_dir)) for d in dirs)
    ledger.jobs.journals_read([i for ids in dirs.values() for i in ids], now)
    settle(ledger, site, now, limit=SETTLE_BATCH)  # cost and reports then sum them; they settle the rest
    return ReconcileResult(
        changed, len(dirs), records, supervise(ledger, client, site) if supervise_runs else [], poller.warning
    )
