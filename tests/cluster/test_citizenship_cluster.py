"""A good citizen on a shared scheduler, measured by slurmctld's own RPC counters (sdiag): polling 1,000
jobs, a sweep tick and a reconcile cost at most one job-information RPC per poll cycle, whatever the count."""

from __future__ import annotations

import re
import subprocess
from collections import Counter

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.ledger import Ledger
from hpctrain.slurm import SlurmClient
from hpctrain.submit import Submitter

from helpers.cli import run_cli

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
# What squeue, scontrol show job and sacct-like job queries cost the controller.
JOB_INFO = ("REQUEST_JOB_INFO", "REQUEST_JOB_INFO_SINGLE", "REQUEST_JOB_USER_INFO")
_RPC = re.compile(r"^\s+(\w+)\s+\(\s*\d+\)\s+count:(\d+)")


def controller_rpcs() -> Counter:
    """slurmctld's RPC counts by message type."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    section = out.split("by message type", 1)[1].split("by user", 1)[0]
    return Counter({m[1]: int(m[2]) for m in map(_RPC.match, section.splitlines()) if m})


class HeldClient(SlurmClient):
    """Submits held jobs: they stay pending, so the test measures polling alone."""

    def run(self, command: str, *args: str, **kw) -> str:  # type: ignore[override]
        return super().run(command, *(("--hold",) if command == "sbatch" else ()), *args, **kw)


def test_polling_a_thousand_jobs_costs_at_most_one_job_query_per_poll(dev_cluster, isolated_ledger, slurm_calls):
    env, calls = slurm_calls
    site = load_site("dev")
    spec = JobSpec.model_validate({"name": "held", "command": ["true"], "launcher": "none",
                                   "resources": {"mem": "100M", "time": "5"}, "array": {"count": 1000}})
    with Ledger(isolated_ledger) as ledger:
        sub = Submitter(site, ledger, HeldClient.for_site(site)).submit(spec, "<test>")
    try:
        polls = 4
        before = controller_rpcs()
        watch = run_cli("status", "--watch", "--count", str(polls), "--interval", "0.1", "--max-interval", "0.1",
                        "--json", env=env)
        assert watch.returncode == 0, watch.stderr
        assert all(len(json_line) > 2 for json_line in watch.stdout.splitlines())
        assert run_cli("reconcile", env=env).returncode == 0
        assert run_cli("sweep", "tick", env=env).returncode == 0  # no sweep: a controller ping and a refresh
        after = controller_rpcs()
    finally:
        SlurmClient.for_site(site).scancel(sub.slurm_ids)
    cycles = polls + 2
    job_queries = sum(after[t] - before[t] for t in JOB_INFO)
    assert job_queries <= cycles, {t: after[t] - before[t] for t in JOB_INFO}
    # Each cycle is one sacct call (answered by slurmdbd, not the controller); the tick adds one ping; status
    # asks the controller once why the held jobs wait (once a minute under --watch).
    assert calls()["sacct"] == cycles and calls()["squeue"] == 1 and calls()["scontrol"] == 1
