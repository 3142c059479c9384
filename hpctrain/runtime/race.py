"""A race between one job's submissions to several placements (`hpctrain submit --race K`): the first batch script
to claim the race file runs the command; every other one cancels itself before it (`hpctrain attempt start`), and
the polls cancel those still pending once one has started (hpctrain.jobs.poll)."""

from __future__ import annotations

import os
from pathlib import Path


def claim(path: Path, slurm_job_id: str) -> bool:
    """Whether the Slurm job ``slurm_job_id`` holds the race at ``path``: it claims it now, or had (a winner Slurm
    requeued runs again). The claim is a link(2) of a file already holding the id: atomic on NFS too, and whoever
    loses reads a whole id."""
    mine = path.with_name(f".{path.name}.{slurm_job_id}")
    mine.write_text(slurm_job_id + "\n")
    try:
        os.link(mine, path)
        return True
    except FileExistsError:
        return path.read_text().strip() == slurm_job_id
    finally:
        mine.unlink(missing_ok=True)
