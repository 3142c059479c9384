"""Submission and status against the live dev cluster."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.contract import JobPaths
from hpctrain.jobs.logs import LABEL
from hpctrain.jobs.poll import Poller, job_summaries
from hpctrain.launch.rendezvous import expand_hostlist
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.runtime.attempts import RunPolicy
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.states import TERMINAL
from hpctrain.submit import Submitter

from helpers.cli import run_cli
from helpers.cluster import DEV_CLUSTER
from helpers.paths import ASSETS
from helpers.waiting import wait_until

pytestmark = pytest.mark.slurm
SPECS = ASSETS / "specs"


def wait_finished(ledger_path: Path, timeout: float = 120) -> list[dict]:
    site = load_site("dev")
    with Ledger(ledger_path) as ledger:
        poller = Poller(ledger, SlurmClient.for_site(site), "dev")

        def done():
            poller.refresh()
            rows = job_summaries(ledger, "dev")
            return rows if rows and all(r["state"] in TERMINAL for r in rows) else None

        return wait_until(done, timeout, 1.0, "jobs to finish")


def submit_spec(data: dict, ledger_path: Path, **kw):
    site = load_site("dev")
    with Ledger(ledger_path) as ledger:
        return Submitter(site, ledger).submit(JobSpec.model_validate(data), "<test>", **kw)


def outputs(job_dir: str) -> str:
    return "".join(p.read_text() for p in sorted(Path(job_dir).glob("slurm-*.out")))


def test_specs_run_and_secrets_stay_out(dev_cluster, isolated_ledger, slurm_calls):
    env, counts = slurm_calls
    env = {**env, "API_TOKEN": "tok-5f0e1d2c"}
    subs = {}
    for name in ("single", "distributed", "array"):
        out = run_cli("submit", str(SPECS / f"{name}.toml"), "--json", env=env)
        assert out.returncode == 0, out.stderr
        subs[name] = json.loads(out.stdout)
    assert counts()["sbatch"] == 3
    rows = {r["name"]: r for r in wait_finished(isolated_ledger)}
    assert {r["state"] for r in rows.values()} == {"COMPLETED"}
    with Ledger(isolated_ledger) as ledger:
        jobs = Table(ledger, "jobs").rows()
        dirs = {r["name"]: r["job_dir"] for r in jobs}
        dist_nodes = ledger.attempts.of_job(next(r["id"] for r in jobs if r["name"] == "dist"))[-1]["node_list"]
    assert outputs(dirs["single"]).startswith("hello from n")
    assert "it's $(not) a `command` 12" in outputs(dirs["single"])
    ranks = sorted(ln for ln in LABEL.sub("", outputs(dirs["dist"])).splitlines() if ln.startswith("rank"))
    assert [ln.split()[1] for ln in ranks] == ["0", "1", "2", "3"]
    # Every rank's master is its allocation's first node: n1 when Slurm placed it there, not always so under load.
    master = expand_hostlist(dist_nodes)[0]
    assert all(ln.endswith(f"of 4 {master}") for ln in ranks), (ranks, dist_nodes)
    lines = sorted(outputs(dirs["arr"]).splitlines())
    assert len(lines) == 6 and lines[0] == 'task 0 param 0 {"layers": 2, "lr": 0.1}'
    # Submit resolved each job's run policy beside its spec: what the batch script's `hpctrain attempt` follows.
    for d in dirs.values():
        files = JobPaths(Path(d))
        assert RunPolicy.from_json(json.loads(files.policy_file.read_text())) == \
            RunPolicy.of(json.loads(files.spec_file.read_text()))
    # The secret reached the job but no file hpctrain wrote, nor the ledger.
    written = [Path(d) / f for d in dirs.values() for f in os.listdir(d) if f.endswith((".sh", ".json", ".jsonl"))]
    assert written and not any(b"tok-5f0e1d2c" in p.read_bytes() for p in written)
    assert not any(b"tok-5f0e1d2c" in p.read_bytes() for p in isolated_ledger.parent.glob("ledger.db*"))


def test_throttle_holds_and_status_counts_each_task_once(dev_cluster, isolated_ledger):
    sub = submit_spec({"name": "throttle", "command": ["sleep", "2"], "launcher": "none",
                       "resources": {"mem": "100M", "time": "5"}, "array": {"count": 20, "throttle": 3}},
                      isolated_ledger)
    restarts = set()
    with Ledger(isolated_ledger) as ledger:
        # a ledger written before the fix: task 0's pending-range twin as a second, never-started run
        ledger.attempts.record(sub.ledger_ids[0], 0, 1, state="PENDING")
        poller = Poller(ledger, SlurmClient.for_site(load_site("dev")), "dev")

        def done():
            poller.refresh()
            restarts.update(r["restarts"] for r in Table(ledger, "array_tasks").rows())
            return Table(ledger, "jobs").rows()[0]["state"] in TERMINAL

        wait_until(done, 180, 0.5, "the array to finish")
        # sacct lists a started task in the pending-range row too, for a while: never a second run
        assert restarts == {0}
        attempts = ledger.attempts.of_job(sub.ledger_ids[0])
        assert [(a["task_index"], a["attempt"], a["state"]) for a in attempts] == \
            [(t, 0, "COMPLETED") for t in range(20)]
        assert Table(ledger, "jobs").rows()[0]["state"] == "COMPLETED"
    rows = SlurmClient().sacct(sub.slurm_ids, ("JobID", "State", "Start", "End"))
    spans = [(r["Start"], r["End"]) for r in rows if r["State"] == "COMPLETED"]
    assert len(spans) == 20
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda x: (x[0], x[1]))
    running = peak = 0
    for _, delta in events:
        running += delta
        peak = max(peak, running)
    assert 2 <= peak <= 3


@pytest.fixture
def small_max_array_size(dev_cluster):
    """Restart the dev cluster's controller with MaxArraySize=5, and back."""
    def up(size: str) -> None:
        subprocess.run([DEV_CLUSTER, "up"], check=True, capture_output=True,
                       env={**os.environ, "HPCTRAIN_DEV_MAX_ARRAY_SIZE": size})

    up("5")
    yield 5
    up("1001")


@pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason=(
    "host's Slurm only, for CI time (90 s): passed on 24.11.5 and 26.05.5 (0.917 and 0.911 with 9-12 s tasks)"))
def test_a_throttled_sweep_past_max_array_size_keeps_its_tasks_running(small_max_array_size, isolated_ledger,
                                                                        slurm_calls):
    """23 tasks %4 split by the cluster's MaxArraySize=5 into 5 arrays: each parameter set runs once, and four tasks
    run while any waits, as in one array, instead of each chunk waiting for the slowest task of the one before
    (0.48 of the time with 2-5 s tasks). Slurm itself takes a fraction of a second to start the next task after
    one ends (within one array too): the tasks run long enough for that to stay well under a tenth of the time."""
    assert SlurmClient().config()["MaxArraySize"] == "5"
    env, counts = slurm_calls
    spec = {"name": "wide", "launcher": "none", "resources": {"mem": "100M", "time": "5"},
            "command": ["bash", "-c", "echo idx=$HPCTRAIN_PARAM_INDEX $HPCTRAIN_PARAMS; "
                                      "sleep $((12 + HPCTRAIN_PARAM_INDEX * 7 % 4))"],
            "array": {"params": [{"x": i} for i in range(23)], "throttle": 4}}
    spec_path = isolated_ledger.parent / "wide.toml"
    spec_path.write_text(_toml(spec))
    out = run_cli("submit", str(spec_path), "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert counts()["sbatch"] == 5
    slurm_ids = json.loads(out.stdout)["slurm_ids"]
    client, looks = SlurmClient(), []  # (tasks running, tasks pending), the controller's view five times a second
    states: list[str] = []
    while len(states) < 23 or not TERMINAL.issuperset(states):  # COMPLETING is neither running nor pending
        states = [r["State"] for r in client.squeue_states(slurm_ids)]
        looks.append((states.count("RUNNING"), states.count("PENDING")))
        assert len(looks) < 5 * 180, "the array did not finish in 3 minutes"
        time.sleep(0.2)
    assert states == ["COMPLETED"] * 23  # none cancelled for a dependency Slurm found invalid
    assert max(running for running, _ in looks) == 4
    first = next(i for i, (running, _) in enumerate(looks) if running)
    last = max(i for i, (_, pending) in enumerate(looks) if pending)  # from here on, fewer than four are left
    window = looks[first:last + 1]
    full = sum(running == 4 for running, _ in window) / len(window)
    assert full >= 0.9, f"four tasks ran {full:.2f} of the time a task waited: {window}"
    wait_finished(isolated_ledger, 60)
    with Ledger(isolated_ledger) as ledger:
        job_dir = Table(ledger, "jobs").rows()[0]["job_dir"]
        mapped = sorted(r["param_index"] for r in Table(ledger, "array_tasks").rows())
    assert mapped == list(range(23))
    assert sorted(outputs(job_dir).splitlines()) == sorted(f'idx={i} {{"x": {i}}}' for i in range(23))


def _toml(data: dict) -> str:
    """Enough TOML for the test specs (tables one level deep, JSON-compatible values)."""
    top = [f"{k} = {json.dumps(v)}" for k, v in data.items() if not isinstance(v, dict)]
    tables = [f"[{k}]\n" + "\n".join(f"{kk} = {_toml_value(vv)}" for kk, vv in v.items())
              for k, v in data.items() if isinstance(v, dict)]
    return "\n".join(top) + "\n\n" + "\n\n".join(tables) + "\n"


def _toml_value(v) -> str:
    if isinstance(v, list) and v and isinstance(v[0], dict):
        return "[" + ", ".join("{ " + ", ".join(f"{a} = {json.dumps(b)}" for a, b in d.items()) + " }" for d in v) + "]"
    return json.dumps(v)


@pytest.mark.parametrize("edit, message", [
    ({"partition": "bigmem"}, "resources.partition: partition 'bigmem' is not in site 'dev' (has: debug, gpu)"),
    ({"gpus_per_node": 8}, "resources.gpus_per_node: 8 GPUs per node requested, partition 'gpu' has 4"),
    ({"account": "teamb", "qos": "deadline"}, "resources.qos: QOS 'deadline' on partition 'gpu' is not allowed for account 'teamb'"),
    ({"account": "teamz"}, "resources.account: user 'root' has no association with account 'teamz' (has: root, teama, teamb)"),
    ({"time": "3-00:00:00"}, "resources.time: 3-00:00:00 requested, partition 'gpu' allows 2-00:00:00"),
])
def test_bad_input_is_refused_before_submission(dev_cluster, isolated_ledger, slurm_calls, tmp_path, edit, message):
    env, counts = slurm_calls
    spec = tmp_path / "bad.toml"
    spec.write_text(_toml({"name": "bad", "command": ["true"], "resources": {"mem": "100M", **edit}}))
    out = run_cli("submit", str(spec), env=env)
    assert out.returncode == 2
    assert out.stderr == f"hpctrain: error: {spec}: {message}\n"
    assert counts()["sbatch"] == 0
    with Ledger(isolated_ledger) as ledger:
        assert Table(ledger, "jobs").rows() == []


def test_dry_run_renders_and_submits_nothing(dev_cluster, isolated_ledger, slurm_calls):
    env, counts = slurm_calls
    out = run_cli("submit", str(SPECS / "distributed.toml"), "--dry-run", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("#!/bin/bash\n") and "#SBATCH --nodes=2" in out.stdout
    assert counts()["sbatch"] == 0
    with Ledger(isolated_ledger) as ledger:
        assert Table(ledger, "jobs").rows() == []


def test_associations_are_cached_and_read_again_before_refusing(dev_cluster, isolated_ledger, slurm_calls, tmp_path):
    env, counts = slurm_calls
    spec = tmp_path / "assoc.toml"

    def dry_run(account: str) -> subprocess.CompletedProcess[str]:
        spec.write_text(_toml({"name": "assoc", "command": ["true"], "resources": {"mem": "100M", "account": account}}))
        return run_cli("submit", str(spec), "--dry-run", env=env)

    assert dry_run("teama").returncode == 0
    first = counts()["sacctmgr"]  # the user's associations and the QOS's per-user limits
    assert dry_run("teama").returncode == 0
    assert counts()["sacctmgr"] == first
    # A cache from before the user was added to teamb: read again rather than refused.
    with Ledger(isolated_ledger) as ledger:
        rows = json.loads(ledger.site_cache.get("dev", "assoc:root")["value_json"])
        ledger.site_cache.put("dev", "assoc:root", [r for r in rows if r["account"] != "teamb"])
    assert dry_run("teamb").returncode == 0
    assert dry_run("teamb").returncode == 0
    assert counts()["sacctmgr"] == first + 1
    out = dry_run("teamz")
    assert out.returncode == 2 and "has no association with account 'teamz'" in out.stderr
    assert counts()["sacctmgr"] == first + 2


def test_injection_attempts_run_as_plain_data(dev_cluster, isolated_ledger, tmp_path):
    marker = tmp_path / "pwned"
    nasty = [f"$(touch {marker})", f"`touch {marker}`", f"'; touch {marker}; '", f"a\n#SBATCH --uid=bob\ntouch {marker}"]
    workdir = tmp_path / "dir $(x) `y` 'z'"
    workdir.mkdir()
    sub = submit_spec({"name": "inject", "launcher": "none", "workdir": str(workdir),
                       "command": ["python", "-c", "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['V'], os.getcwd()]))", *nasty],
                       "env": {"V": nasty[3]}, "resources": {"mem": "100M", "time": "5"}}, isolated_ledger)
    wait_finished(isolated_ledger)
    with Ledger(isolated_ledger) as ledger:
        job_dir = ledger.jobs.get(sub.ledger_ids[0])["job_dir"]
    args, env_value, cwd = json.loads(outputs(job_dir).splitlines()[-1])
    assert args == nasty and env_value == nasty[3] and cwd == str(workdir)
    assert not marker.exists()
    user = subprocess.run(["sacct", "-X", "-n", "-P", "-j", sub.slurm_ids[0], "--format=User"],
                          capture_output=True, text=True).stdout.split()
    assert user == ["root"]


def test_a_job_runs_in_a_workdir_named_like_an_option(dev_cluster, isolated_ledger, tmp_path, monkeypatch):
    """A relative workdir '-P' (cd would read it as its option and go to $HOME), the command after srun's '--'."""
    (tmp_path / "-P").mkdir()
    monkeypatch.chdir(tmp_path)  # sbatch's working directory: where a relative workdir starts
    sub = submit_spec({"name": "dash-dir", "workdir": "-P", "command": ["python", "-c", "import os; print(os.getcwd())"],
                       "resources": {"mem": "100M", "time": "5"}}, isolated_ledger)
    assert wait_finished(isolated_ledger)[0]["state"] == "COMPLETED"
    with Ledger(isolated_ledger) as ledger:
        job_dir = ledger.jobs.get(sub.ledger_ids[0])["job_dir"]
    assert outputs(job_dir).splitlines()[-1] == str(tmp_path / "-P")


def test_cancel_and_show(dev_cluster, isolated_ledger):
    sub = submit_spec({"name": "sleeper", "command": ["sleep", "300"], "launcher": "none",
                       "resources": {"mem": "100M", "time": "10"}}, isolated_ledger)
    out = run_cli("cancel", str(sub.ledger_ids[0]))
    assert out.returncode == 0 and out.stdout.strip() == f"cancelled 1 job(s): {sub.slurm_ids[0]}"
    (row,) = wait_finished(isolated_ledger)
    assert row["state"] == "CANCELLED"
    shown = json.loads(run_cli("show", str(sub.ledger_ids[0]), "--json").stdout)
    assert [e["kind"] for e in shown["events"]] == ["placement", "submitted", "cancel_requested"]
    assert shown["attempts"][0]["state"] == "CANCELLED"


def test_checkpoints_every_auto_steps_get_the_interruptions_of_jobs_alike(dev_cluster, isolated_ledger):
    """At submit, the ledger's runs of the last 30 days in the same partition and QOS on as many GPUs: a run of an
    earlier job alike preempted without a word (it journaled no stop saved on a notice) counts, over its running
    time."""
    spec = {"name": "auto-ckpt", "command": ["true"], "launcher": "none", "checkpoint": {"every_steps": "auto"},
            "resources": {"gpus_per_node": 1, "mem": "100M", "time": "10"}}
    first = submit_spec(spec, isolated_ledger)
    with Ledger(isolated_ledger) as ledger:
        ledger.attempts.record(first.ledger_ids[0], -1, 7, state="PREEMPTED", alloc_gpus=1,
                               started_at=time.time() - 7200, ended_at=time.time() - 3600)
    second = submit_spec(spec, isolated_ledger)
    saved = json.loads(second.files.interruptions_file.read_text())
    where = second.placement
    assert (saved["events"], saved["in_place"]) == (1, 0) and 3600 <= saved["exposure_s"] < 3700
    assert saved["like"] == f"partition {where.partition}, QOS {where.qos}, 1 GPUs, 30 days"
    assert not first.files.interruptions_file.read_text().startswith('{"events": 1')


def test_status_makes_one_sacct_call_per_poll_for_1000_jobs(dev_cluster, isolated_ledger, slurm_calls):
    env, counts = slurm_calls
    real = submit_spec({"name": "real", "command": ["true"], "launcher": "none",
                        "resources": {"mem": "100M", "time": "5"}, "array": {"count": 3}}, isolated_ledger)
    with Ledger(isolated_ledger) as ledger:
        ledger.db.table("jobs").insert_all(
            {"name": f"synthetic{i}", "site": "dev", "slurm_job_id": str(900000 + i), "state": "PENDING",
             "submitted_at": time.time()} for i in range(997)
        )
    def finished():
        rows = SlurmClient().sacct(real.slurm_ids, ("JobID", "State"))
        return len(rows) == 3 and {r["State"] for r in rows} == {"COMPLETED"}

    wait_until(finished, 60)
    out = run_cli("status", "--all", "--limit", "2000", "--watch", "--interval", "0.1", "--count", "3", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert counts()["sacct"] == 3
    # Why the pending jobs wait: one squeue for the whole --watch (a minute apart); no limit named, no scontrol.
    assert counts()["squeue"] == 1 and counts()["scontrol"] == 0
    last = json.loads(out.stdout.splitlines()[-1])
    assert len(last) == 998
    (mine,) = [r for r in last if r["slurm_job_id"] == real.slurm_ids[0]]
    assert mine["state"] == "COMPLETED" and mine["task_states"] == "COMPLETED:3"
