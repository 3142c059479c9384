"""Starting a session from the login node: the checks that can be made before submitting, the submission (the
same placement, limits, quota checks and ledger as any job), the wait until JupyterLab answers; a session that
does not come up is cancelled, so none is left holding GPUs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteConfig
from hpctrain.errors import HpctrainError
from hpctrain.interactive.connect import Session, wait_ready
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.states import TERMINAL
from hpctrain.submit import Submitter
from hpctrain.submit.placement import Placement

NEEDS = ("jupyterlab", "ipykernel")


@dataclass(frozen=True)
class Started:
    job_id: int
    slurm_job_id: str
    placement: Placement
    session: Session


def check_jupyter(site: SiteConfig, spec: JobSpec) -> None:
    """Refuse before submitting when the Python the job would run (no container: the site's launch.python, else
    this one) lacks JupyterLab. An image, or a Python this host cannot run, is checked on the node."""
    python = Path(site.launch.python or sys.executable)
    if spec.container is not None or not python.is_file() or (spec.interactive and spec.interactive.shell):
        return
    probe = subprocess.run(
        [str(python), "-c", f"import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in {NEEDS}))"],
        capture_output=True,
    )
    if probe.returncode:
        raise HpctrainError(
            f"JupyterLab is not installed for {python}: pip install 'hpctrain[notebook]' there "
            "(or give --image with an image that has it)"
        )


def start(
    site: SiteConfig,
    ledger: Ledger,
    client: SlurmClient,
    spec: JobSpec,
    timeout_s: float,
    origin: str = "<notebook>",
    on_submitted: Callable[[int, str], None] = lambda job_id, slurm_job_id: None,
) -> Started:
    """Submit ``spec`` (an interactive session's, hpctrain.interactive.session_spec) and wait for its server;
    ``on_submitted`` hears of the job once it is in the queue."""
    check_jupyter(site, spec)
    sub = Submitter(site, ledger, client).submit(spec, origin)
    job_id = sub.ledger_ids[0]
    on_submitted(job_id, sub.slurm_ids[0])
    try:
        session = wait_ready(ledger, client, site.name, job_id, timeout_s)
    except BaseException:  # a failure, a timeout, Ctrl-C: no session left waiting for GPUs or holding them
        from hpctrain.jobs.cancel import cancel_jobs

        job = ledger.jobs.known(job_id)
        if job["state"] not in TERMINAL:
            cancel_jobs(ledger, lambda _: client, job)  # its own site's: it was just submitted there
        raise
    return Started(job_id, sub.slurm_ids[0], sub.placement, session)
