"""Secrets on the dev cluster, which keeps job environments in accounting (AccountingStoreFlags=job_env):
every run of a job sees its secret, a requeued one too, while neither slurmctld's state nor accounting ever
holds it, also when the submitting shell exports it."""

from __future__ import annotations

import hashlib
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.jobs.poll import Poller
from hpctrain.ledger import Ledger
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.states import TERMINAL
from hpctrain.submit import Submitter

from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def holding(root: Path, needle: str) -> list[str]:
    """The files under ``root`` whose bytes contain ``needle`` (slurmctld may replace one meanwhile)."""
    found = []
    for p in root.rglob("*"):
        try:
            if p.is_file() and needle.encode() in p.read_bytes():
                found.append(str(p))
        except FileNotFoundError:
            pass
    return sorted(found)


def env_vars(slurm_id: str) -> str:
    """What accounting keeps of the job's environment."""
    return subprocess.run(["sacct", "-j", slurm_id, "--env-vars"], capture_output=True, text=True, check=True).stdout


def test_a_secret_reaches_every_run_and_never_slurm(dev_cluster, isolated_ledger, tmp_path, monkeypatch):
    secret, plain = f"tok-{secrets.token_hex(12)}", f"plain-{secrets.token_hex(12)}"
    # Both exported in the submitting shell: sbatch (--export=ALL) must pass on the plain one only.
    monkeypatch.setenv("API_TOKEN", secret)
    monkeypatch.setenv("HPCTRAIN_TEST_PLAIN", plain)
    seen = tmp_path / "seen"
    # Each run writes its restart count and whether it has the secret (never the secret); the first waits
    # to be requeued.
    check = (f"import hashlib, os, time; n = os.environ.get('SLURM_RESTART_COUNT', '0'); "
             f"ok = hashlib.sha256(os.environ.get('API_TOKEN', '').encode()).hexdigest() == "
             f"{hashlib.sha256(secret.encode()).hexdigest()!r}; "
             f"open({str(seen)!r}, 'a').write(f'{{n}} {{ok}}\\n'); time.sleep(600 if n == '0' else 0)")
    spec = {"name": "secretive", "command": [sys.executable, "-c", check], "launcher": "none",
            "resources": {"mem": "100M", "time": "00:10:00", "account": "teama"},
            "env": {"API_TOKEN": {"secret": True}, "PLAIN": "visible"}}
    site = load_site("dev")
    client = SlurmClient.for_site(site)
    state_dir = Path(client.config()["StateSaveLocation"])
    with Ledger(isolated_ledger) as ledger:
        job = ledger.jobs.get(Submitter(site, ledger).submit(JobSpec.model_validate(spec), "<test>").ledger_ids[0])
        slurm_id, job_dir = job["slurm_job_id"], Path(job["job_dir"])
        wait_until(lambda: seen.exists() and seen.read_text(), 60, 0.5, "the first run to start")

        # slurmctld keeps the job's environment in its state: the plain value, not the secret.
        assert holding(state_dir, plain) and holding(state_dir, secret) == []
        # So does accounting, once the job's start reached it.
        wait_until(lambda: plain in env_vars(slurm_id), 30, 1.0, "accounting to keep the job's environment")
        assert secret not in env_vars(slurm_id)
        (secrets_file,) = job_dir.glob("secrets-*.env")
        assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600

        client.requeue(slurm_id)
        wait_until(lambda: client.show_job(slurm_id).get("Restarts") == "1", 30, 0.5, "the requeue")
        assert holding(state_dir, secret) == []  # nor while it waits to run again
        poller = Poller(ledger, client, "dev")
        wait_until(lambda: poller.refresh() >= 0 and ledger.jobs.get(job["id"])["state"] in TERMINAL, 120, 1.0,
                   "the second run to finish")
        assert ledger.jobs.get(job["id"])["state"] == "COMPLETED"

    assert seen.read_text().splitlines() == ["0 True", "1 True"]  # both runs had the secret
    assert holding(state_dir, secret) == [] and secret not in env_vars(slurm_id)
    assert not secrets_file.exists()  # removed once the job will not run again
    assert secret not in "".join(p.read_text() for p in job_dir.glob("slurm-*.out"))
