"""Submitting a recorded job again exactly: its stored spec, from the directory it was submitted in."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteConfig
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit.lineage import differences, lineage
from hpctrain.submit.submitter import Submission, Submitter


@dataclass
class Rerun:
    original: int  # ledger id of the submission's first job
    submission: Submission
    differences: list[str]  # how the new lineage differs from the recorded one


def rerun(site: SiteConfig, ledger: Ledger, client: SlurmClient, job: dict[str, Any]) -> Rerun:
    """Submit ``job``'s submission again; relative paths in its command resolve as they did then."""
    first = ledger.jobs.known(job["group_id"] or job["id"])
    spec = JobSpec.model_validate(json.loads(first["spec_json"] or "{}"))
    recorded = json.loads(first["lineage_json"] or "{}")
    here = os.getcwd()
    try:
        if recorded.get("cwd"):
            os.chdir(recorded["cwd"])
        new = lineage(spec, rerun_of=first["id"])
        sub = Submitter(site, ledger, client).submit(spec, f"<rerun of job {first['id']}>", lineage=new)
    finally:
        os.chdir(here)
    return Rerun(first["id"], sub, differences(recorded, new))
