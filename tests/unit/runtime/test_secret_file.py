"""Secrets files (no Slurm): created 0600, sourced by the script verbatim, never handed to sbatch, removed
by the poller once the job is final."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from hpctrain.runtime import secret_file
from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.contract import JobPaths
from hpctrain.jobs.poll import Poller
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.slurm import SlurmClient
from hpctrain.submit.placement import Placement
from hpctrain.submit.render import render_script

VALUES = {"TOKEN": "s3cr3t-9f2c", "NASTY": "it's \"q\"\n$(touch /tmp/pwned) `x` \\ ; rm -rf /"}


def test_the_file_is_0600_from_its_first_byte_and_gives_back_every_value(tmp_path, monkeypatch):
    old = os.umask(0)  # a wide umask widens nothing: the mode is the open's
    try:
        path = secret_file.write(tmp_path, 7, VALUES)
    finally:
        os.umask(old)
    assert path == secret_file.path(tmp_path, 7) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret_file.read(tmp_path, 7) == VALUES
    shell = subprocess.run(["bash", "-c", f'. {path}; printf "%s\\0" "$TOKEN" "$NASTY"'],
                           capture_output=True, text=True, check=True, env={"PATH": os.environ["PATH"]})
    assert shell.stdout.split("\0")[:2] == list(VALUES.values())
    with pytest.raises(FileExistsError):  # never rewritten in place
        secret_file.write(tmp_path, 7, VALUES)
    assert secret_file.write(tmp_path, 8, {}) is None and not secret_file.path(tmp_path, 8).exists()
    assert secret_file.remove(tmp_path, 7) and not path.exists() and not secret_file.remove(tmp_path, 7)


def test_the_script_sources_the_file_and_holds_no_value(monkeypatch):
    monkeypatch.delenv("HPCTRAIN_DEV_ROOT", raising=False)
    spec = JobSpec.model_validate({"name": "t", "command": ["python", "train.py"],
                                   "env": {"TOKEN": {"value": VALUES["TOKEN"], "secret": True}, "PLAIN": "visible"}})
    script = render_script(spec, load_site("dev"), Placement("gpu", "normal", "teama", "test"),
                           JobPaths(Path("/shared/logs/job-42")), "42")
    assert VALUES["TOKEN"] not in script
    assert "# From the submitting environment (secret, not written here): TOKEN\n" in script
    assert "secrets_file=/shared/logs/job-42/secrets-42.env\n" in script and '  . "$secrets_file"\n' in script
    assert script.index('. "$secrets_file"') < script.index("attempt start")  # before the step


def test_sbatch_inherits_no_secret(tmp_path, monkeypatch):
    """With --export=ALL Slurm keeps whatever sbatch inherits: a secret exported in the user's shell too."""
    seen = tmp_path / "env"
    (tmp_path / "sbatch").write_text(f"#!/bin/sh\nenv > {seen}\necho 123\n")
    (tmp_path / "sbatch").chmod(0o755)
    monkeypatch.setenv("TOKEN", VALUES["TOKEN"])
    client = SlurmClient(bin_dir=tmp_path)
    assert client.sbatch("#!/bin/bash\n", env={"EXTRA": "1"}, unset_env=["TOKEN", "NOT_SET"]) == "123"
    env = seen.read_text()
    assert VALUES["TOKEN"] not in env and "EXTRA=1\n" in env


class Sacct(SlurmClient):
    def __init__(self, states: dict[str, str]):
        super().__init__()
        self.states = states

    def sacct(self, job_ids, fields):
        return [{"JobID": i, "State": self.states[i], "ExitCode": "0:0", "Submit": "2026-01-01T00:00:00",
                 "Start": "2026-01-01T00:00:01", "End": "2026-01-01T00:00:02", "ElapsedRaw": "1", "NodeList": "n1",
                 "AllocTRES": "", "Reason": "None"} for i in job_ids]


def test_the_poller_removes_the_file_once_the_job_runs_no_more(tmp_path, isolated_ledger):
    """COMPLETED and CANCELLED are final; a FAILED run may still be requeued by reconcile (it keeps the file)."""
    states = {"101": "COMPLETED", "102": "CANCELLED", "103": "FAILED", "104": "RUNNING"}
    with Ledger(isolated_ledger) as ledger:
        ids = {}
        for slurm_id in states:
            ids[slurm_id] = Table(ledger, "jobs").insert({"name": "t", "site": "dev", "user": "u", "state": "PENDING",
                                                          "slurm_job_id": slurm_id, "job_dir": str(tmp_path),
                                                          "is_array": 0, "spec_json": "{}"})
            secret_file.write(tmp_path, ids[slurm_id], VALUES)
        Poller(ledger, Sacct(states), "dev").refresh()
        assert {s: ledger.jobs.get(i)["state"] for s, i in ids.items()} == states
    assert {s: secret_file.path(tmp_path, i).exists() for s, i in ids.items()} == {
        "101": False, "102": False, "103": True, "104": True}
