"""`hpctrain reconcile`: fold what compute nodes wrote (journals) and what Slurm knows (sacct) into the ledger.

Run by hand or from cron on the login node; safe to run concurrently and repeatedly.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from hpctrain.contract import JobPaths
from hpctrain.jobs.accounting import SETTLE_BATCH, settle
from hpctrain.jobs.poll import Poller
from hpctrain.jobs.supervise import Decision, supervise
from hpctrain.jobs.unsent import settle_unsent
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.jobs import JOURNALS_READ_S
from hpctrain.ledger.journal import Journal
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import TERMINAL

SETTLED_S = 60.0


@dataclass
class ReconcileResult:
    changed_jobs: int
    journals: int
    records: int
    decisions: list[Decision]
    warning: str | None = None  # accounting (sacct) down: states came from squeue
    evaluations_failed: int = 0  # evaluation jobs that ended without a result
    unsent: list[str] = field(default_factory=list)  # submissions whose submitter died, settled (jobs.unsent)


def reconcile(ledger: Ledger, client: SlurmClient, site: str, supervise_runs: bool = True) -> ReconcileResult:
    """One sacct call for every active job, every journal of active or recently ended jobs, then (unless
    ``supervise_runs`` is off, as for `status`) a decision for each run that died without making one, after the
    submissions whose submitter died are settled (found in Slurm, or failed). An evaluation whose job has ended
    without a result (its journal read) is failed: it may be asked again."""
    unsent = settle_unsent(ledger, client, site) if supervise_runs else []
    poller = Poller(ledger, client, site)
    changed = poller.refresh()
    now = time.time()
    dirs = ledger.jobs.journals_to_read(site, TERMINAL, now - JOURNALS_READ_S)
    records = read_journals(ledger, [JobPaths.journal_of(d) for d in dirs])
    ledger.jobs.journals_read([i for ids in dirs.values() for i in ids], now)
    closed = ledger.evaluations.close_ended(TERMINAL)
    settle(ledger, site, now, limit=SETTLE_BATCH)  # cost and reports then sum them; they settle the rest
    return ReconcileResult(
        changed,
        len(dirs),
        records,
        supervise(ledger, client, site) if supervise_runs else [],
        poller.warning,
        len(closed),
        unsent,
    )


def read_journals(ledger: Ledger, journals: list[str]) -> int:
    """Fold in the records of ``journals`` (their directories) whose directory changed since it was last read
    through (its mtime, taken before the listing, so a record renamed in meanwhile changes it again); how many were
    new. An mtime younger than SETTLED_S is not noted: a record written within the file system's timestamp
    granularity, or under a clock a little behind ours, might leave it as it was."""
    records = 0
    with ledger.reading():
        seen = ledger.ingested.seen(journals)
        for journal in journals:
            try:
                mtime = os.stat(journal).st_mtime_ns
            except FileNotFoundError:
                continue  # not made yet: the job has not started
            except OSError:
                mtime = None  # unreadable: listed as ever
            if mtime is not None and seen.get(journal) == mtime:
                continue
            records += ingest_journal(ledger, Journal(journal))
            if mtime is not None and time.time_ns() - mtime > SETTLED_S * 1e9:
                ledger.ingested.saw(journal, mtime)
    return records
