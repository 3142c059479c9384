"""Submissions whose submitter died between recording the job (state SUBMITTING) and recording what Slurm answered:
killed by cron's `timeout`, a scrontab limit, a closed terminal.

Each submitter holds a shared lock beside the ledger (`submitting`) from before it records a job until it has
recorded Slurm's id or the failure. A supervision (reconcile, a sweep tick) that finds SUBMITTING rows takes the
lock exclusively, without waiting: had it, every such row is one whose submitter died, and it is settled by its own
key: the job's sbatch comment (`JobPaths.submission_tag`) among the jobs the controller holds, else a record in the
job's journal (it ran, and the controller has forgotten it since); then the job is followed under that id. Where
neither has it, Slurm never took it: SUBMIT_FAILED, which a sweep submits again as a new trial.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from hpctrain.contract import JobPaths
from hpctrain.errors import SlurmError
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.rows import JobRow
from hpctrain.runtime import secret_file
from hpctrain.slurm import sacct
from hpctrain.slurm.client import SlurmClient

KILLED = "its submitter was killed before Slurm took it"
# POSIX locks belong to a process, and closing any descriptor of a file drops them all: one descriptor a process
# and lock file, with the number of its submissions under way.
_guard = threading.Lock()
_held: dict[Path, tuple[int, int]] = {}


def lock_path(ledger: Ledger) -> Path:
    return ledger.path.with_name(ledger.path.name + ".submit-lock")


@contextmanager
def submitting(ledger: Ledger) -> Iterator[None]:
    """Held (shared) while this process records a job and submits it; waits while a settler holds it (a squeue)."""
    path = lock_path(ledger)
    with _guard:
        fd, count = _held.get(path) or (os.open(path, os.O_RDWR | os.O_CREAT, 0o666), 0)
        if not count:
            fcntl.lockf(fd, fcntl.LOCK_SH)
        _held[path] = fd, count + 1
    try:
        yield
    finally:
        with _guard:
            fd, count = _held.pop(path)
            if count > 1:
                _held[path] = fd, count - 1
            else:
                os.close(fd)


def settle_unsent(ledger: Ledger, client: SlurmClient, site: str) -> list[str]:
    """Settle the site's SUBMITTING rows whose submitter died (see the module's docstring); a line for each."""
    if not ledger.jobs.unsent(site):
        return []  # the usual answer: no lock taken
    path = lock_path(ledger)
    with _guard:
        if path in _held:
            return []  # this process submits: its rows are under way
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return []  # a submitter is alive: a later supervision settles what it leaves
            settled = []
            for row in ledger.jobs.unsent(site):
                try:
                    settled.append(_settle(ledger, client, row))
                except SlurmError as exc:  # Slurm cannot say: the row stays as it is for a later supervision
                    settled.append(f"job {row['id']}: unsent or not, Slurm cannot say yet: {exc}")
            return settled
        finally:
            os.close(fd)


def _settle(ledger: Ledger, client: SlurmClient, row: JobRow) -> str:
    job_id, job_dir = row["id"], row["job_dir"]
    slurm_id = _found(client, job_id, job_dir) if job_dir else None
    with ledger.transaction():
        if slurm_id is None:
            ledger.jobs.submit_failed(job_id, KILLED)
            ledger.event("submit_failed", KILLED, job_id=job_id)
        else:
            ledger.jobs.submitted(job_id, slurm_id, at=row["updated_at"])  # a SUBMITTING row's: when recorded
            how = f"slurm job {slurm_id}, found again after its submitter was killed"
            ledger.event("submitted", how, job_id=job_id, slurm_job_id=slurm_id)
    if slurm_id is None:
        secret_file.remove(job_dir, job_id)
        return f"job {job_id}: {KILLED}"
    return f"job {job_id}: slurm job {slurm_id}, found again after its submitter was killed"


def _found(client: SlurmClient, job_id: int, job_dir: str) -> str | None:
    """The Slurm id of the job's sbatch: by its comment in the controller, else by its journal (an array's own id
    through accounting); None where neither has it."""
    if found := client.find_by_comment(JobPaths(Path(job_dir)).submission_tag(str(job_id))):
        return found
    journal = Journal(JobPaths.journal_of(job_dir))
    for _, rec in journal.records():
        if rec.get("job_id") == job_id and rec.get("slurm_job_id"):
            return next(iter(sacct.by_job(client.sacct([rec["slurm_job_id"]], sacct.FIELDS))), rec["slurm_job_id"])
    return None
