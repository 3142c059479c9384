"""A race between one job's submissions to several placements (`hpctrain submit --race K`), on one cluster or on
several that see one logs folder: the first batch script to claim the race file runs the command; every other one
cancels itself before it (`hpctrain attempt start`), and the polls cancel those still pending once one has started
(hpctrain.jobs.poll)."""

from __future__ import annotations

import os
from pathlib import Path


def runner(job_id: int) -> str:
    """A runner as its claim names it: its ledger id, unique across the clusters of a race (Slurm ids are not)."""
    return f"job {job_id}"


def claim(path: Path, job_id: int) -> bool:
    """Whether the runner of ledger id ``job_id`` holds the race at ``path``: it claims it now, or had (a winner
    Slurm requeued runs again). The claim is a link(2) of a file already holding the runner: atomic on NFS too,
    and whoever loses reads a whole name."""
    mine = path.with_name(f".{path.name}.{job_id}")
    mine.write_text(runner(job_id) + "\n")
    try:
        os.link(mine, path)
        return True
    except FileExistsError:
        return won(path.read_text().strip(), job_id, None)
    finally:
        mine.unlink(missing_ok=True)


def won(claimed: str, job_id: int, slurm_job_id: str | None) -> bool:
    """Whether a race file's text ``claimed`` names this runner: its ledger id, or its Slurm id (claimed by a
    runner of an hpctrain before ledger ids, whose race may still be under way)."""
    return claimed == runner(job_id) or (slurm_job_id is not None and claimed == slurm_job_id)
