"""Shared fixtures: the live dev cluster, an isolated ledger per test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ["OMP_NUM_THREADS"] = "1"

REPO = Path(__file__).resolve().parents[1]
DEV_CLUSTER = REPO / "scripts" / "dev-cluster"
HPCTRAIN = [sys.executable, "-m", "hpctrain"]
# A job spec taking every GPU of the dev cluster's three nodes in QOS high: whatever runs in QOS low is preempted.
HIGH = {"name": "urgent", "command": ["sleep", "2"], "launcher": "none",
        "resources": {"nodes": 3, "gpus_per_node": 4, "tasks_per_node": 1, "mem": "1G", "time": "5",
                      "qos": "high", "account": "teama"}}


@pytest.fixture(scope="session")
def dev_cluster() -> dict[str, str]:
    """The dev cluster, started if it is not running (and then stopped at the end of the session)."""
    started = subprocess.run([DEV_CLUSTER, "status"], capture_output=True).returncode != 0
    if started:
        up = subprocess.run([DEV_CLUSTER, "up"], capture_output=True, text=True)
        assert up.returncode == 0, f"scripts/dev-cluster up failed:\n{up.stdout}\n{up.stderr}"
    conf = subprocess.run([DEV_CLUSTER, "env"], capture_output=True, text=True, check=True).stdout
    slurm_conf = conf.strip().split("=", 1)[1]
    os.environ["SLURM_CONF"] = slurm_conf
    yield {"SLURM_CONF": slurm_conf}
    if started and not os.environ.get("HPCTRAIN_KEEP_CLUSTER"):
        subprocess.run([DEV_CLUSTER, "down"], capture_output=True)


@pytest.fixture(autouse=True)
def isolated_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test writes its own ledger file, never the user's; jobs it leaves behind are cancelled."""
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("HPCTRAIN_LEDGER", str(path))
    yield path
    if path.exists():
        import sqlite3

        ids = [r[0] for r in sqlite3.connect(path).execute("SELECT slurm_job_id FROM jobs WHERE slurm_job_id IS NOT NULL")]
        if ids and "SLURM_CONF" in os.environ:
            subprocess.run(["scancel", *ids], capture_output=True)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `hpctrain ARGS` in a fresh process, as a user would."""
    return subprocess.run(
        [*HPCTRAIN, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def wait_until(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    import time

    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def sacct_gpu_hours(slurm_id: str) -> float:
    """sacct's own numbers: every run of the job, GPUs x ElapsedRaw."""
    out = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-o", "ElapsedRaw,AllocTRES", "-j", slurm_id],
                         capture_output=True, text=True, check=True).stdout
    total = 0.0
    for line in out.splitlines():
        elapsed, tres = line.split("|")
        gpus = dict(t.split("=") for t in tres.split(",") if "=" in t).get("gres/gpu", "0")
        total += int(elapsed) * int(gpus) / 3600
    return total


SHIMMED = ("sbatch", "sacct", "squeue", "sacctmgr", "sshare", "scontrol", "scancel", "sinfo")


@pytest.fixture
def slurm_calls(tmp_path: Path):
    """PATH wrappers that log every Slurm command run by hpctrain; returns (env, counts())."""
    import shutil
    from collections import Counter

    bin_dir, log = tmp_path / "shim-bin", tmp_path / "slurm-calls.log"
    bin_dir.mkdir()
    for cmd in SHIMMED:
        real = shutil.which(cmd)
        wrapper = bin_dir / cmd
        wrapper.write_text(f'#!/bin/bash\necho "{cmd}" >> {log}\nexec {real} "$@"\n')
        wrapper.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def counts() -> Counter:
        return Counter(log.read_text().split()) if log.exists() else Counter()

    return env, counts
