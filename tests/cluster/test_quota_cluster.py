"""Quotas against the dev cluster's real limits (scripts/dev-cluster: teamb runs at most 8 GPUs at once,
teama has a GPU-minute budget, QOS normal caps each user's GPUs and queued jobs, QOS low its wall time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.config.types import parse_slurm_time
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.slurm import SlurmClient
from hpctrain.submit import Submitter

from helpers.cli import run_cli
from helpers.paths import REPO
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason=(
    "host's Slurm only (CI time): every release's quota reads and pending reasons are replayed from recordings "
    "(test_slurm_outputs, tests/assets/slurm_outputs/record.py)"))]


def sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _gpus(tres: str) -> float | None:
    found = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
    return float(found["gres/gpu"]) if "gres/gpu" in found else None


def sacctmgr_limits() -> set[tuple[str, str, float]]:
    """(where, Slurm's name, value) of every GPU, job and wall limit sacctmgr lists for root's accounts and QOS."""
    found: set[tuple[str, str, float]] = set()
    fields = "account,user,grptres,grptresmins,grpjobs,grpsubmit,maxjobs,maxsubmit,maxwall,maxtres"
    for line in sh("sacctmgr", "-n", "-P", "show", "assoc", "where", "account=teama,teamb", f"format={fields}").splitlines():
        account, user, grptres, grpmins, grpjobs, grpsubmit, maxjobs, maxsubmit, maxwall, maxtres = line.split("|")
        if user not in ("", "root"):
            continue
        where = f"account {account}" if not user else f"{account}/{user}"
        values = {"GrpTRES:gres/gpu": _gpus(grptres), "GrpTRESMins:gres/gpu": _gpus(grpmins),
                  "GrpJobs": grpjobs, "GrpSubmitJobs": grpsubmit}
        if user:
            values.update({"MaxJobs": maxjobs, "MaxSubmitJobs": maxsubmit, "MaxTRESPJ:gres/gpu": _gpus(maxtres),
                           "MaxWallPJ": parse_slurm_time(maxwall) / 60 if maxwall else None})
        found |= {(where, k, float(v)) for k, v in values.items() if v not in (None, "")}
    fields = "name,grptres,grptresmins,grpjobs,maxwall,maxtres,maxtrespu,maxjobspu,maxsubmitpu"
    for line in sh("sacctmgr", "-n", "-P", "show", "qos", f"format={fields}").splitlines():
        name, grptres, grpmins, grpjobs, maxwall, maxtres, maxtrespu, maxjobspu, maxsubmitpu = line.split("|")
        values = {("", "GrpTRES:gres/gpu"): _gpus(grptres), ("", "GrpTRESMins:gres/gpu"): _gpus(grpmins),
                  ("", "GrpJobs"): grpjobs, ("", "MaxTRESPJ:gres/gpu"): _gpus(maxtres),
                  ("", "MaxWallPJ"): parse_slurm_time(maxwall) / 60 if maxwall else None,
                  (" per user", "MaxTRESPU:gres/gpu"): _gpus(maxtrespu), (" per user", "MaxJobsPU"): maxjobspu,
                  (" per user", "MaxSubmitJobsPU"): maxsubmitpu}
        found |= {(f"QOS {name}{suffix}", k, float(v)) for (suffix, k), v in values.items() if v not in (None, "")}
    return found


def test_quota_matches_sacctmgr_and_sshare(dev_cluster, isolated_ledger):
    out = run_cli("quota", "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert {(q["scope"], q["slurm_name"], q["limit"]) for q in shown} == sacctmgr_limits()
    assert {("account teamb", "GrpTRES:gres/gpu", 8.0), ("QOS normal per user", "MaxTRESPU:gres/gpu", 12.0)} \
        <= {(q["scope"], q["slurm_name"], q["limit"]) for q in shown}
    # What teama spent against its budget is sshare's GrpTRESRaw (whole minutes in slurmctld's view).
    budget = next(q for q in shown if q["scope"] == "account teama" and q["slurm_name"] == "GrpTRESMins:gres/gpu")
    rows = sh("sshare", "-l", "-P", "-n", "-A", "teama", "-o", "Account,User,GrpTRESRaw").splitlines()
    spent = _gpus(next(r.split("|")[2] for r in rows if r.split("|")[1] == ""))
    assert abs(budget["used"] - spent) <= 1 and budget["left"] == budget["limit"] - budget["used"]
    narrowed = json.loads(run_cli("quota", "--account", "teamb", "--json").stdout)
    assert narrowed and all("teama" not in q["scope"] for q in narrowed)
    # `cost --by account` puts the budget beside the GPU-hours (teamb has none).
    with Ledger(isolated_ledger) as ledger:
        for job_id, account in ((1, "teama"), (2, "teamb")):
            Table(ledger, "jobs").insert({"name": "done", "site": "dev", "account": account, "user": "root",
                                          "partition": "gpu", "state": "COMPLETED"})
            ledger.attempts.record(job_id, -1, 0, alloc_gpus=2, started_at=0.0, ended_at=1800.0, elapsed_s=1800.0,
                                   cause="completed")
    rows = {r["account"]: r for r in json.loads(run_cli("cost", "--json").stdout)}
    assert rows["teama"]["gpu_hours"] == 1.0 and rows["teama"]["budget_gpu_hours"] == budget["limit"] / 60
    assert abs(rows["teama"]["budget_spent_gpu_hours"] - spent / 60) <= 1 / 60
    assert "budget_gpu_hours" not in rows["teamb"]


@contextmanager
def sub_account(name: str, parent: str) -> Iterator[None]:
    """A temporary account below ``parent`` with root as its user."""
    sh("sacctmgr", "-i", "add", "account", name, f"parent={parent}")
    try:
        sh("sacctmgr", "-i", "add", "user", "root", f"account={name}")
        yield
    finally:
        subprocess.run(["sacctmgr", "-i", "delete", "user", "root", "where", f"account={name}"], capture_output=True)
        sh("sacctmgr", "-i", "delete", "account", name)


def test_a_parent_accounts_cap_holds_for_the_accounts_below_it(dev_cluster, isolated_ledger, tmp_path):
    """Slurm enforces teamb's running-GPU cap on an account below teamb too: quota shows it for that account, and
    submit refuses a job over it there."""
    with sub_account("teamb_sub", "teamb"):
        shown = json.loads(run_cli("quota", "--account", "teamb_sub", "--json").stdout)
        assert [(q["scope"], q["limit"], q["covers"]) for q in shown if q["slurm_name"] == "GrpTRES:gres/gpu"] == [
            ("account teamb", 8, ["teamb_sub"])]
        spec = _spec(tmp_path, "too-wide", 3, 4, 1, account="teamb_sub")
        out = run_cli("submit", str(spec))
        assert out.returncode == 2
        assert out.stderr.endswith("the job can never start as 'teamb_sub': account teamb allows 8 running GPUs; "
                                   "the job asks 12 GPUs\n")


def _spec(tmp_path: Path, name: str, nodes: int, gpus: int, seconds: int, account: str = "teamb",
          until: Path | None = None) -> Path:
    """A job of ``nodes`` x ``gpus`` that sleeps ``seconds``, or (``until``) until that file exists."""
    path = tmp_path / f"{name}.toml"
    command = ["sleep", str(seconds)] if until is None else ["sh", "-c", f"until [ -e {until} ]; do sleep 0.2; done"]
    path.write_text(f'name = "{name}"\ncommand = {json.dumps(command)}\nlauncher = "none"\n\n[resources]\n'
                    f'nodes = {nodes}\ngpus_per_node = {gpus}\ntasks_per_node = 1\nmem = "100M"\ntime = "5"\n'
                    f'account = "{account}"\n')
    return path


def test_a_job_over_the_running_gpu_cap_is_refused_before_sbatch(dev_cluster, isolated_ledger, slurm_calls, tmp_path):
    env, counts = slurm_calls
    spec = _spec(tmp_path, "too-wide", 3, 4, 1)
    out = run_cli("submit", str(spec), env=env)
    assert out.returncode == 2
    assert out.stderr == (f"hpctrain: error: {spec}: resources.account: the job can never start as 'teamb': "
                          "account teamb allows 8 running GPUs; the job asks 12 GPUs\n")
    assert counts()["sbatch"] == 0
    with Ledger(isolated_ledger) as ledger:
        assert Table(ledger, "jobs").rows() == []


def test_a_job_behind_the_cap_is_warned_shown_waiting_and_runs_when_it_frees(dev_cluster, isolated_ledger, tmp_path):
    release = tmp_path / "release"  # the 8 GPUs are held until the test has seen the other job wait
    hold = run_cli("submit", str(_spec(tmp_path, "cap-hold", 2, 4, 0, until=release)), "--json")
    assert hold.returncode == 0 and hold.stderr == "", hold.stderr
    wait_until(lambda: "RUNNING" in sh("squeue", "-h", "-o", "%T", "-j", str(json.loads(hold.stdout)["slurm_ids"][0])),
               30, 0.3, "the 8-GPU job to run")
    behind = run_cli("submit", str(_spec(tmp_path, "cap-wait", 1, 1, 1)), "--json")
    assert behind.returncode == 0
    assert behind.stderr == "hpctrain: warning: it will wait: account teamb's running GPUs cap: 8 of 8 in use\n"
    job_id = json.loads(behind.stdout)["ledger_ids"][0]

    def waiting() -> str | None:
        rows = {r["id"]: r for r in json.loads(run_cli("status", "--json").stdout)}
        return rows[job_id]["waiting"] if job_id in rows else None

    assert wait_until(waiting, 30, 0.5, "status to say why the job waits") == (
        "its account's running-GPU cap is reached: account teamb, 8 of 8 GPUs in use")
    shown = run_cli("show", str(job_id)).stdout
    assert "waits: its account's running-GPU cap is reached: account teamb, 8 of 8 GPUs in use" in shown
    release.touch()

    def states() -> list[str] | None:
        rows = json.loads(run_cli("status", "--all", "--json").stdout)
        found = [r["state"] for r in rows]
        return found if found and all(s not in ("PENDING", "RUNNING") for s in found) else None

    assert wait_until(states, 60, 1.0, "both jobs to end") == ["COMPLETED", "COMPLETED"]


@contextmanager
def teama_budget(gpu_minutes: int) -> Iterator[None]:
    """teama's GPU-minute budget set to ``gpu_minutes`` for a moment (scripts/dev-cluster's afterwards)."""
    def budget(value: int) -> None:
        sh("sacctmgr", "-i", "modify", "account", "where", "name=teama", "set", f"GrpTRESMins=gres/gpu={value}")
        wait_until(lambda: f"gres/gpu={value}(" in sh("scontrol", "show", "assoc_mgr", "accounts=teama",
                                                      "flags=assoc").split("UserName=root")[0], 30, 0.2,
                   "slurmctld to take the budget")
    try:
        budget(gpu_minutes)
        yield
    finally:
        budget(10_000_000)


def test_auto_leaves_out_an_account_whose_budget_is_spent(dev_cluster, isolated_ledger):
    site = load_site("dev")
    spec = JobSpec.model_validate({"name": "auto", "command": ["true"], "launcher": "none",
                                   "resources": {"gpus_per_node": 1, "mem": "100M", "time": "5", "account": "auto"}})
    with teama_budget(0), Ledger(isolated_ledger) as ledger:
        placement = Submitter(site, ledger, SlurmClient.for_site(site)).submit(spec, "<test>", dry_run=True).placement
        assert placement.account == "teamb"
        assert "left out teama: account teama's GPU-minutes budget: " in placement.reason
        assert placement.reason.endswith("of 0 spent, the job may use 5")


def test_a_sweep_runs_no_more_trials_at_once_than_the_cap_lets_run(dev_cluster, isolated_ledger, tmp_path):
    """max_parallel 10 on teamb (8 running GPUs) with trials of 2 GPUs: each tick keeps 4 going and says why;
    no trial ever waits on the cap, and every trial runs once."""
    trial = REPO / "scripts" / "examples" / "sweep_trial.py"
    spec = tmp_path / "capped.toml"
    spec.write_text(f'name = "capped"\nmetric = "loss"\ndirection = "minimize"\nmethod = "random"\nmax_trials = 10\n'
                    f'max_parallel = 10\n[search]\nx = {{ type = "uniform", low = -2.0, high = 2.0 }}\n'
                    f'y = {{ type = "uniform", low = -2.0, high = 2.0 }}\n\n[job]\nname = "capped-trial"\n'
                    f'command = ["{sys.executable}", "{trial}", "--steps", "3", "--step-s", "0.1"]\nlauncher = "none"\n'
                    f'resources = {{ mem = "100M", time = "00:05:00", account = "teamb", gpus_per_node = 2, '
                    f'tasks_per_node = 1 }}\n')
    out = run_cli("sweep", "start", str(spec))
    assert out.returncode == 0, out.stderr
    assert "sweep capped: 4 submitted, 0 resubmitted, 0 stopped early; ACTIVE\n  4 trials at once, not 10: account " \
           "teamb's running GPUs cap (8) holds 4 jobs of 2 GPUs\n" in out.stdout

    def done() -> bool:
        assert "AssocGrpGRES" not in sh("squeue", "-h", "-t", "PENDING", "-A", "teamb", "-o", "%r")
        tick = run_cli("sweep", "tick", "capped")
        assert tick.returncode == 0, tick.stderr
        return "DONE" in tick.stdout

    wait_until(done, 240, 1.0, "the sweep's trials to finish")
    with Ledger(isolated_ledger) as ledger:
        trials = Table(ledger, "trials").rows()
        slurm_ids = [j["slurm_job_id"] for j in ledger.jobs.of_sweep("capped")]
    assert len(trials) == 10 and {t["state"] for t in trials} == {"completed"}
    runs = sh("sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State", "-j", ",".join(slurm_ids)).split()
    assert len(runs) == 10 and {r.split("|")[1] for r in runs} == {"COMPLETED"}
