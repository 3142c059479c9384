"""scripts/dev-cluster brings up a real Slurm cluster: idempotent, 3 nodes x 4 GPUs, QOS preemption."""

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from hpctrain.ledger import Ledger
from hpctrain.slurm.states import TERMINAL

from helpers.cli import run_cli
from helpers.cluster import DEV_CLUSTER, RACER, SECOND_CLUSTER_PORT_OFFSET, dev_port_base
from helpers.lanes import lanes
from helpers.paths import REPO
from helpers.waiting import wait_until

pytestmark = pytest.mark.slurm


WIDE = """name = "wide"
command = ["sleep", "5"]
launcher = "none"
[resources]
nodes = 3
gpus_per_node = 4
tasks_per_node = 1
mem = "1G"
time = "00:10:00"
account = "teama"
"""


def second_site(tmp_path: Path, root: Path) -> Path:
    """The dev site config for the cluster in ``root``, named c2, its logs folder the first's (where a race over
    both keeps its file)."""
    dev = "${HPCTRAIN_DEV_ROOT:-/var/tmp/hpctrain-dev}"
    text = (REPO / "site_configs" / "dev.toml").read_text()
    text = text.replace(dev, str(root)).replace(f'logs = "{root}/logs"', f'logs = "{dev}/logs"')
    path = tmp_path / "c2.toml"
    path.write_text(text.replace('name = "dev"', 'name = "c2"'))
    return path


def sh(*cmd: str, env: dict[str, str] | None = None) -> str:
    """CMD's stdout; a failure names CMD with its stderr. `up` may take minutes on a busy machine."""
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=900)
    assert out.returncode == 0, f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


def daemon_pids(env: dict[str, str] | None = None) -> dict[str, str]:
    out = subprocess.run([DEV_CLUSTER, "status"], capture_output=True, text=True, env={**os.environ, **(env or {})})
    return {f[0]: f[3] for f in (ln.split() for ln in out.stdout.splitlines()) if len(f) == 4 and f[1] == "up"}


def running(command: str) -> bool:
    return subprocess.run(["pgrep", "-fx", command], capture_output=True).returncode == 0


def test_up_again_is_a_no_op(dev_cluster):
    before = daemon_pids()
    assert len(before) == 7
    out = sh(str(DEV_CLUSTER), "up")
    assert "already up" in out
    assert f"SLURM_CONF={dev_cluster['SLURM_CONF']}" in out
    assert daemon_pids() == before


def test_three_nodes_with_four_gpus_each(dev_cluster):
    nodes = sh("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N %G %t").split("\n")[:-1]
    assert [n.split()[:2] for n in nodes] == [["n1", "gpu:4"], ["n2", "gpu:4"], ["n3", "gpu:4"]]
    parts = sh("sinfo", "-h", "-o", "%P").split()
    assert parts == ["gpu*", "debug"]


def test_gpus_are_allocated_per_node(dev_cluster):
    """Each node gives the step two of its four GPUs (which two depends on what a job ending before still holds)."""
    out = sh("srun", "-N3", "--gpus-per-node=2", "-t", "1", "bash", "-c", 'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES"')
    given = dict(line.split() for line in out.splitlines())
    assert sorted(given) == ["n1", "n2", "n3"]
    for gpus in given.values():
        indices = gpus.split(",")
        assert len(set(indices)) == 2 and set(indices) <= {"0", "1", "2", "3"}, given


def test_qos_preemption_relation(dev_cluster):
    rows = sh("sacctmgr", "-n", "-P", "show", "qos", "format=name,priority,preempt,preemptmode").splitlines()
    qos = {r.split("|")[0]: r.split("|")[1:] for r in rows}
    assert set(qos) == {"low", "normal", "high", "deadline"}
    assert qos["high"][1] == "low"
    assert qos["low"][2] == "requeue"
    assert int(qos["high"][0]) > int(qos["normal"][0]) > int(qos["low"][0])
    conf = sh("scontrol", "show", "config")
    assert "preempt/qos" in conf and "priority/multifactor" in conf


def test_accounts_have_distinct_fairshare(dev_cluster):
    rows = sh("sacctmgr", "-n", "-P", "show", "assoc", "where", "user=", "format=account,share").splitlines()
    shares = dict(r.split("|") for r in rows)
    assert shares["teama"] != shares["teamb"]
    users = sh("sacctmgr", "-n", "-P", "show", "assoc", "format=account,user").splitlines()
    assert {"teama|alice", "teamb|bob", "teama|root", "teamb|root"} <= set(users)


@pytest.mark.slow
@lanes(why="scripts/dev-cluster's own bookkeeping; a whole second cluster costs each lane a minute of CPU")
def test_second_cluster_down_then_up_leaves_the_first_alone(dev_cluster, isolated_ledger, tmp_path):
    """A cluster in another root: up, down (only its own daemons and jobs), up again. Meanwhile the two clusters are
    two sites of one ledger (issue 63): a job of three whole nodes, while the first holds a node's GPUs, is ranked and
    submitted to the second; `status` and `cost` show it beside a job of the first; a race over both runs once, its
    losers cancelled on their own clusters; `cancel` of a job of the second asks the second; with the second down,
    `where` leaves it out in one line, and `status` says so in one line and shows its jobs as last seen."""
    # munged runs as the munge user: its root must be reachable by others (pytest's tmp is 0700).
    root = Path(tempfile.mkdtemp(prefix="hpctrain-c2-", dir="/var/tmp"))
    root.chmod(0o755)
    base = dev_port_base() + SECOND_CLUSTER_PORT_OFFSET  # ports of its own (helpers.cluster)
    env = {"HPCTRAIN_DEV_ROOT": str(root), "HPCTRAIN_DEV_PORT_BASE": str(base)}
    conf = {"SLURM_CONF": str(root / "etc" / "slurm.conf")}
    first = daemon_pids()
    # Jobs that outlast the test at any load (it took 185 s once, past a 171 s sleep): it ends each itself.
    first_job = sh("sbatch", "--parsable", "-t", "30", "-o", "/dev/null", "--wrap", "sleep 1771").strip()
    held: list[str] = []  # a node's GPUs on the first cluster
    try:
        sh(str(DEV_CLUSTER), "up", env=env)
        second = daemon_pids(env)
        assert len(second) == 7 and not set(second.values()) & set(first.values())
        # A job still running when its cluster goes down goes with it, slurmstepd included.
        sh("sbatch", "-t", "30", "-o", "/dev/null", "--wrap", "sleep 1772", env=conf)
        wait_until(lambda: running("sleep 1771") and running("sleep 1772"), 120, 0.5, "a job on each cluster")
        both, spec, narrow = f"dev,{second_site(tmp_path, root)}", tmp_path / "wide.toml", tmp_path / "narrow.toml"
        spec.write_text(WIDE)
        held.append(sh("sbatch", "--parsable", "-t", "30", "-o", "/dev/null", "--gres=gpu:4", "--wrap", "sleep 1773"))
        wait_until(lambda: running("sleep 1773"), 60, 0.5, "a node's GPUs held on the first")
        ranked = json.loads(run_cli("where", str(spec), "--site", both, "--json").stdout)["candidates"]
        assert (ranked[0]["site"], ranked[0]["partition"]) == ("c2", "gpu") and ranked[0]["start"] <= time.time()
        assert {c["site"] for c in ranked} == {"dev", "c2"}
        # the first cluster: after its held node, or after QOS normal's 12 GPUs a user (root holds 4 of them there)
        assert all(c["start"] is None or c["start"] > time.time() for c in ranked if c["site"] == "dev"), ranked
        out = run_cli("submit", "--soonest", "--site", both, str(spec), "--json")
        assert out.returncode == 0, out.stderr
        submitted = json.loads(out.stdout)
        assert submitted["site"] == "c2" and submitted["reason"].startswith("soonest: c2: gpu/normal as teama now")
        assert sh("squeue", "-h", "-j", submitted["slurm_ids"][0], "-o", "%P", env=conf).strip() == "gpu"
        # A job of one GPU on the first: status and cost span both clusters, each job followed on its own.
        narrow.write_text(WIDE.replace("nodes = 3", "nodes = 1").replace("gpus_per_node = 4", "gpus_per_node = 1"))
        assert run_cli("submit", str(narrow)).returncode == 0

        def both_done() -> list[dict]:
            rows = json.loads(run_cli("status", "--site", both, "--all", "--json").stdout)
            return rows if {(r["site"], r["state"]) for r in rows} == {("dev", "COMPLETED"), ("c2", "COMPLETED")} else []

        assert len(wait_until(both_done, 180, 2.0, "a job on each site to complete")) == 2
        spent = {r["site"]: r["gpu_hours"] for r in json.loads(run_cli("cost", "--site", both, "--by", "job",
                                                                        "--json").stdout)}
        assert spent.keys() == {"dev", "c2"} and spent["c2"] > spent["dev"] > 0, spent  # 12 GPUs against 1
        assert "site" in run_cli("status", "--site", both, "--all").stdout.splitlines()[2]  # the table's site column
        # A race over both clusters (gpu and debug on each, all free): exactly one runner runs the command, the
        # others are cancelled on their own clusters by the polls of each; status shows it once, on the winner's.
        (racer := tmp_path / "racer.toml").write_text(RACER.format(ran=str(tmp_path / "ran")))
        out = run_cli("submit", "--race", "4", "--site", both, str(racer), "--json")
        assert out.returncode == 0, out.stderr
        raced = json.loads(out.stdout)
        assert sorted(r["site"] for r in raced["runners"]) == ["c2", "c2", "dev", "dev"], raced

        def race_over() -> dict[int, str]:
            shown = {r["id"]: r for r in json.loads(run_cli("status", "--site", both, "--all", "--json").stdout)}
            with Ledger(isolated_ledger) as ledger:
                states = {i: ledger.jobs.known(i)["state"] for i in raced["ledger_ids"]}
            return {**states, "shown": shown[min(states)]} if set(states.values()) <= TERMINAL else {}

        over = wait_until(race_over, 180, 2.0, "the race to end, its losers cancelled")
        shown, ran = over.pop("shown"), (tmp_path / "ran").read_text().split()
        assert len(ran) == 1 and over[int(ran[0])] == "COMPLETED", (ran, over)
        assert sorted(over.values()) == ["CANCELLED"] * 3 + ["COMPLETED"], over
        winner = raced["runners"][raced["ledger_ids"].index(int(ran[0]))]["site"]
        assert (shown["state"], shown["site"]) == ("COMPLETED", winner)
        # A job of the second cluster is cancelled there, whichever site `cancel` is given: its own, or, where its
        # config is not found by name, one line asking for it and nothing cancelled anywhere.
        narrow.write_text(narrow.read_text().replace('["sleep", "5"]', '["sleep", "300"]'))
        out = run_cli("submit", "--site", str(both.split(",")[1]), str(narrow), "--json")
        assert out.returncode == 0, out.stderr
        job, slurm_id = json.loads(out.stdout)["ledger_ids"][0], json.loads(out.stdout)["slurm_ids"][0]
        refused = run_cli("cancel", str(job))
        assert refused.returncode != 0 and refused.stderr.startswith(
            f"hpctrain: error: job {job} runs on site 'c2', not 'dev': give --site its config"), refused.stderr
        assert len(refused.stderr.splitlines()) == 1 and running("sleep 1771")
        assert run_cli("cancel", "--site", both.split(",")[1], str(job)).returncode == 0
        wait_until(lambda: sh("sacct", "-X", "-n", "-P", "-o", "State", "-j", slurm_id, env=conf).startswith(
            "CANCELLED"), 60, 1.0, "the second cluster's job to be cancelled")
        sh(str(DEV_CLUSTER), "down", env=env)
        down = run_cli("where", str(spec), "--site", both, "--json")
        assert down.returncode == 0 and "Traceback" not in down.stderr, down.stderr
        shown = json.loads(down.stdout)
        assert {c["site"] for c in shown["candidates"]} == {"dev"}
        [gone] = [line for line in shown["left_out"] if line.startswith("site c2: ")]
        assert "\n" not in gone
        status = run_cli("status", "--site", both, "--all", "--json")  # c2's jobs as last seen, in one line
        assert status.returncode == 0 and len(json.loads(status.stdout)) == 4, status.stderr  # the race as one
        assert [ln for ln in status.stderr.splitlines() if "site c2 left out" in ln] == status.stderr.splitlines()
        assert daemon_pids(env) == {}
        for pid in second.values():
            assert not os.path.exists(f"/proc/{pid}")
        assert daemon_pids() == first
        wait_until(lambda: not running("sleep 1772"), 30, 0.2, "the second cluster's job to be gone")
        assert running("sleep 1771")
        out = sh(str(DEV_CLUSTER), "up", env=env)
        assert "up in" in out
        assert sh("sinfo", "-h", "-N", "-p", "gpu", "-o", "%N", env=conf).split() == ["n1", "n2", "n3"]
        assert "teamb" in sh("sacctmgr", "-n", "-P", "show", "account", "format=account", env=conf)
    finally:
        subprocess.run([DEV_CLUSTER, "reset"], env={**os.environ, **env}, capture_output=True)
        subprocess.run(["scancel", first_job, *(h.strip() for h in held)], capture_output=True)
