"""Lineage, rerun, GPU-hours against sacct's own numbers, and secrets kept out of every artifact, on the dev
cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.ledger import Ledger

from helpers.cli import run_cli
from helpers.cluster import sacct_gpu_hours
from helpers.waiting import wait_until

pytestmark = pytest.mark.slurm
GIT = ["git", "-c", "user.email=t@example.org", "-c", "user.name=t"]


def submit_cli(spec: Path, cwd: Path) -> int:
    out = subprocess.run([sys.executable, "-m", "hpctrain", "submit", str(spec), "--json"], cwd=cwd,
                         capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["ledger_ids"][0]


def rerun(job: int, cwd: Path) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-m", "hpctrain", "rerun", str(job)], cwd=cwd, capture_output=True,
                         text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split("ledger id ")[1].split(",")[0]), out.stdout


def test_rerun_has_identical_lineage_until_the_code_changes(dev_cluster, isolated_ledger, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "train.py").write_text("print('training')\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "v1"], check=True)
    (repo / "job.toml").write_text('name = "lin"\ncommand = ["python", "train.py"]\nlauncher = "none"\nseed = 9\n'
                                   'hyperparameters = { lr = 0.5 }\nresources = { mem = "100M", time = "2" }\n')
    first = submit_cli(repo / "job.toml", repo)
    # From elsewhere: the rerun runs from the job's directory, so the same file is found.
    again, out = rerun(first, tmp_path)
    assert "lineage: identical" in out
    shown = run_cli("show", str(again), "--lineage").stdout
    assert f"rerun of job {first}: identical lineage" in shown and "hyperparameters.lr: 0.5" in shown
    assert "code now: as recorded" in shown

    (repo / "train.py").write_text("print('training v2')\n")
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qam", "v2"], check=True)
    assert "code now: differs (commit" in run_cli("show", str(first), "--lineage").stdout
    changed, out = rerun(first, tmp_path)
    assert "lineage differs:" in out and "code.commit:" in out
    shown = run_cli("show", str(changed), "--lineage").stdout
    assert f"rerun of job {first}: lineage differs" in shown and "code.commit:" in shown


def test_gpu_hours_match_sacct_including_a_requeued_job(dev_cluster, isolated_ledger, tmp_path):
    ids = {}
    # The requeued job's first run outlasts any wait for the requeue (on a busy machine a 6 s run had ended,
    # completed, before it: nothing was lost, rightly); its rerun is short.
    first_run = 'if [ \\"${SLURM_RESTART_COUNT:-0}\\" = 0 ]; then sleep 120; else sleep 6; fi'
    for name, gpus, command in (("plain", 2, '"sleep", "4"'), ("requeued", 3, f'"sh", "-c", "{first_run}"')):
        spec = tmp_path / f"{name}.toml"
        spec.write_text(f'name = "{name}"\ncommand = [{command}]\nlauncher = "none"\n'
                        f'resources = {{ gpus_per_node = {gpus}, tasks_per_node = 1, mem = "100M", time = "2", '
                        f'account = "teama" }}\n')
        ids[name] = submit_cli(spec, tmp_path)
    with Ledger(isolated_ledger) as ledger:
        slurm = {n: ledger.jobs.get(i)["slurm_job_id"] for n, i in ids.items()}
    wait_until(lambda: subprocess.run(["squeue", "-h", "-t", "R", "-j", slurm["requeued"]], capture_output=True,
                                      text=True).stdout.strip(), 60, 0.5, "the job to run")
    time.sleep(3)  # some work to lose: the run has no checkpoint
    subprocess.run(["scontrol", "requeue", slurm["requeued"]], check=True)

    def finished():
        rows = json.loads(run_cli("status", "--all", "--json").stdout)
        return {r["state"] for r in rows} == {"COMPLETED"}

    wait_until(finished, 180, 2, "both jobs to complete")
    costs = {r["job"]: r for r in json.loads(run_cli("cost", "--by", "job", "--json").stdout)}
    assert costs[ids["requeued"]]["runs"] == 2 and costs[ids["plain"]]["runs"] == 1
    for name, job in ids.items():
        assert costs[job]["gpu_hours"] == pytest.approx(sacct_gpu_hours(slurm[name]), abs=1e-9)
        assert costs[job]["gpu_hours"] > 0
    # The requeued run did work it had no checkpoint of: lost; the plain job lost nothing.
    assert costs[ids["requeued"]]["lost_gpu_hours"] > 0 and costs[ids["plain"]]["lost_gpu_hours"] == 0
    prices = load_site("dev").gpu_hour_price
    assert costs[ids["plain"]]["cost"] == pytest.approx(costs[ids["plain"]]["gpu_hours"] * prices["gpu"])
    by_account = json.loads(run_cli("cost", "--json", "--no-refresh").stdout)
    assert [r["account"] for r in by_account] == ["teama"]
    assert by_account[0]["gpu_hours"] == pytest.approx(sum(c["gpu_hours"] for c in costs.values()))


SECRET = "s3cr3t-Token-9f2c41d7"


def test_a_secret_appears_in_no_artifact(dev_cluster, isolated_ledger, tmp_path):
    """The job uses the secret (and proves it had it) without printing it: no file hpctrain wrote, no
    ledger byte, no report holds it."""
    spec = tmp_path / "secret.toml"
    spec.write_text(
        'name = "secretive"\nlauncher = "none"\n'
        'command = ["python", "-c", "import os; from hpctrain.runtime import log_metrics; '
        "t = os.environ['API_TOKEN']; print('token length', len(t)); log_metrics(1, loss=len(t))\"]\n"
        'resources = { mem = "100M", time = "2" }\n'
        '[env]\nAPI_TOKEN = { secret = true }\nPLAIN = "visible"\n')
    env = {"API_TOKEN": SECRET}
    sub = run_cli("submit", str(spec), "--json", "--wait", env=env)
    assert sub.returncode == 0, sub.stderr
    job = json.loads(sub.stdout.splitlines()[0])["ledger_ids"][0]
    assert run_cli("reconcile").returncode == 0
    shown = run_cli("show", str(job)).stdout + run_cli("show", str(job), "--json").stdout
    metrics = json.loads(run_cli("metrics", str(job), "--json").stdout)
    assert metrics["loss"] == len(SECRET)  # the job had the secret
    report = tmp_path / "report.html"
    assert run_cli("report", str(job), "--out", str(report)).returncode == 0
    with Ledger(isolated_ledger) as ledger:
        job_dir = Path(ledger.jobs.get(job)["job_dir"])
    artifacts = [p for p in job_dir.rglob("*") if p.is_file()]
    artifacts += [p for p in isolated_ledger.parent.glob(isolated_ledger.name + "*")]  # the ledger, its WAL
    artifacts.append(report)
    assert len(artifacts) > 5
    leaks = [str(p) for p in artifacts if SECRET.encode() in p.read_bytes()]
    assert leaks == [] and SECRET not in shown
    assert b"token length 21" in b"".join(p.read_bytes() for p in job_dir.glob("*.out"))


# Rank 0 works, ranks 1-3 hold their GPUs and do nothing: a script that forgot to spread its work (issue 61). The dev
# cluster's GPUs are fake: each node's sampler reads its local ranks' processes (kind cpu). Rank 0 spins: on a machine
# running three clusters' tests it gets a fair share of a core, a tenth of one or more, which a rank that works only
# part of the time did not (CI: 9.5 % for a third of a core asked); the unit tests have the busy job without alerts.
ONE_RANK_WORKS = (
    "import os, time\nend = time.time() + 240\n"
    "if os.environ['SLURM_LOCALID'] == '0':\n    while time.time() < end: pass\nelse:\n    time.sleep(240)"
)


def test_the_gpus_of_ranks_that_do_nothing_are_named_idle(dev_cluster, isolated_ledger, tmp_path):
    spec = tmp_path / "idle.toml"
    spec.write_text(f'name = "one-rank-works"\ncommand = ["python", "-c", {json.dumps(ONE_RANK_WORKS)}]\n'
                    'resources = { gpus_per_node = 4, mem = "400M", time = "5" }\n'
                    "idle = { sample_s = 1, after_minutes = 0.25, alert_minutes = 0.25 }\n")
    job = submit_cli(spec, tmp_path)

    def named() -> dict | None:
        rows = json.loads(run_cli("status", "--json").stdout)
        found = next((r for r in rows if r["id"] == job), None)
        return found if found and found["gpus"] and found["gpus"]["idle"] else None

    status = wait_until(named, 240, 3, "the sampler's idle GPUs in status")
    assert status["state"] == "RUNNING" and status["gpus"]["kind"] == "cpu"
    assert status["gpus"]["idle"] == ["1", "2", "3"], status["gpus"]
    assert any(a.startswith("idle GPUs: GPUs 1-3 of 4 under 5 % for ") for a in status["alerts"]), status["alerts"]
    busy = status["gpus"]["gpus"][0]
    assert busy["device"] == "0" and busy["mean"] > 5, busy
    shown = " ".join(run_cli("show", str(job)).stdout.split())
    assert "idle GPUs: GPUs 1-3 of 4 under 5 % for" in shown and "does the script use every GPU it asks for?" in shown
    run_cli("cancel", str(job))


def test_a_job_that_only_sleeps_is_cancelled_once_idle_past_its_grace_and_not_requeued(dev_cluster, isolated_ledger,
                                                                                         tmp_path):
    """Two nodes, a GPU each, a command that sleeps, `[idle] action = "cancel"` after 15 s: the samplers of both
    nodes find every GPU idle, one decides, the job ends CANCELLED with its run's cause `idle`, not requeued (a
    reconcile after does not either), and `cost --causes` counts its GPUs' idle time."""
    spec = tmp_path / "sleeps.toml"
    spec.write_text('name = "only-sleeps"\ncommand = ["sleep", "600"]\n'
                    'resources = { nodes = 2, gpus_per_node = 1, mem = "200M", time = "15" }\n'
                    'idle = { sample_s = 1, after_minutes = 0.1, action = "cancel", cancel_minutes = 0.25 }\n')
    job = submit_cli(spec, tmp_path)

    def ended() -> dict | None:
        rows = json.loads(run_cli("status", "--all", "--json").stdout)
        found = next((r for r in rows if r["id"] == job), None)
        return found if found and found["state"] in ("CANCELLED", "COMPLETED", "FAILED") else None

    assert wait_until(ended, 240, 2, "the idle job's end")["state"] == "CANCELLED"
    assert run_cli("reconcile").returncode == 0
    with Ledger(isolated_ledger) as ledger:
        runs = ledger.db.execute("SELECT attempt, cause, requeued, decision FROM attempts WHERE job_id = ?",
                                 [job]).fetchall()
        assert ledger.jobs.get(job)["state"] == "CANCELLED"
    [(attempt, cause, requeued, decision)] = runs
    assert cause == "idle" and requeued == 0 and "cancel_minutes = 0.25" in decision, runs
    shown = " ".join(run_cli("show", str(job)).stdout.split())
    assert "the job is cancelled, not requeued" in shown, shown
    [row] = [r for r in json.loads(run_cli("cost", "--by", "job", "--causes", "--json").stdout) if r["job"] == job]
    assert 2 * 15 * 0.9 / 3600 <= row["idle_gpu_hours"] <= row["gpu_hours"], row
