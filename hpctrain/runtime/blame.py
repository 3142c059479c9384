"""Which rank a failed job step is blamed on: the first to fail on its own, or none when the step hung.

The first failure of a step makes the step's marker (`JobPaths.first_failure`), exclusively, with its cause in it.
A rank that fails on its own and makes it is journaled (`rank_failed`: its node may be bad, hpctrain.launch.nodes).
A hang is decided once, before its kill (the rank's watchdog exiting, its task shim killing it): the hang makes the
marker first, so the peers that then fail because the hung rank is gone (gloo's "Connection reset by peer", before
their own watchdogs fire) find it made and blame no node.
"""

from __future__ import annotations

import os

from hpctrain.contract import JobEnvironment, JobPaths

FAILED, HANG = "failed", "hang"


def claim(cause: str, env: JobEnvironment | None = None) -> bool:
    """Make this job step's failure marker for ``cause`` (FAILED or HANG) and this rank; whether this call made it
    (False outside a job step, and when another rank's failure or a hang came first)."""
    env = env or JobEnvironment()
    if env.job_dir is None or not env.in_slurm:
        return False
    marker = JobPaths(env.job_dir).first_failure(env.step_id)
    try:
        marker.parent.mkdir(exist_ok=True)
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:  # made already (or the job directory cannot take it: nobody is blamed)
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"{cause}: rank {env.rank} on {env.node}\n")
    return True
