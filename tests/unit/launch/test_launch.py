"""hpctrain launch: rendezvous and task variables from Slurm's environment."""

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest

from hpctrain.config import load_site
from hpctrain.errors import HpctrainError
from hpctrain.contract import JobEnvironment
from hpctrain.launch.launcher import launch_env, placement_options, srun_argv
from hpctrain.launch.nodes import choose, excluded_nodes, step_nodes, unhealthy
from hpctrain.launch.rendezvous import expand_hostlist, master_port, task_env, tasks_on_node
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.watchdog import HUNG_EXIT

from helpers.cli import HPCTRAIN
from helpers.paths import ASSETS


def test_hostlist_expansion():
    assert expand_hostlist("n[1-3,7],gpu[08-10],login1") == ["n1", "n2", "n3", "n7", "gpu08", "gpu09", "gpu10", "login1"]
    assert expand_hostlist("a1-ib[2-3]x") == ["a1-ib2x", "a1-ib3x"]
    assert expand_hostlist("rack[1-2]-n[01-02]") == ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
    assert expand_hostlist("n[098-101]") == ["n098", "n099", "n100", "n101"]
    assert expand_hostlist("a[1-2]b[3-4]c[5-6]")[:5] == ["a1b3c5", "a1b3c6", "a2b3c5", "a2b3c6", "a1b4c5"]


@pytest.mark.parametrize("bad", ["n[1-3", "n1-3]", "n[a-b]", "n[5-3]"])
def test_a_hostlist_that_cannot_be_read_is_named(bad):
    with pytest.raises(HpctrainError, match="hostlist"):
        expand_hostlist(bad)


def test_tasks_per_node_run_length_form():
    assert [tasks_on_node("4(x2),3", i) for i in range(3)] == [4, 4, 3]


def test_ports_differ_between_jobs_and_array_tasks():
    rng = (21000, 29999)
    ports = {master_port({"SLURM_JOB_ID": str(j)}, rng, lambda p: True) for j in range(1000, 1100)}
    assert len(ports) == 100 and all(21000 <= p <= 29999 for p in ports)
    a = master_port({"SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "1"}, rng, lambda p: True)
    b = master_port({"SLURM_JOB_ID": "78", "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "2"}, rng, lambda p: True)
    assert a != b


def test_a_restarted_step_starts_from_another_port():
    rng = (21000, 29999)
    ports = [master_port({"SLURM_JOB_ID": "77", "HPCTRAIN_STEP_RESTART": str(k)}, rng, lambda p: True) for k in range(3)]
    assert len(set(ports)) == 3


def test_busy_port_moves_to_the_next_free_one():
    first = master_port({"SLURM_JOB_ID": "5"}, (30000, 30009), lambda p: True)
    busy = {first, first + 1 if first < 30009 else 30000}
    assert master_port({"SLURM_JOB_ID": "5"}, (30000, 30009), lambda p: p not in busy) not in busy
    with pytest.raises(HpctrainError, match="no free port in launch.master_port_range 30000-30009"):
        master_port({"SLURM_JOB_ID": "5"}, (30000, 30009), lambda p: False)


def test_task_env_from_slurm_ids():
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)",
           "SLURM_NODEID": "1"}
    assert task_env(env) == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}
    with pytest.raises(HpctrainError, match="SLURM_PROCID is not set: run this inside an srun task"):
        task_env({})


def test_launch_env_takes_site_network_settings_and_respects_overrides():
    site = load_site("example-ib-cluster")
    env = {"SLURM_JOB_NODELIST": "gpu[017-018]", "SLURM_JOB_ID": "123", "NCCL_DEBUG": "INFO"}
    out = launch_env(site, env)
    assert out["MASTER_ADDR"] == "gpu017"
    assert 29500 <= int(out["MASTER_PORT"]) <= 39499
    assert out["NCCL_IB_HCA"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3" and out["NCCL_DEBUG"] == "INFO"
    with pytest.raises(HpctrainError, match="SLURM_JOB_NODELIST is not set"):
        launch_env(site, {"SLURM_JOB_ID": "1"})


def test_srun_runs_the_task_shim():
    argv = srun_argv(["python", "train.py", "--lr", "1e-3"], python="/venv/bin/python")
    assert argv == ["srun", "--kill-on-bad-exit=1", "--label", "--", "/venv/bin/python", "-m", "hpctrain.launch.task", "--",
                    "python", "train.py", "--lr", "1e-3"]


@pytest.mark.parametrize("runtime", ["pyxis", "apptainer"])
def test_the_rendered_container_launch_line_starts_the_shim_in_the_image(runtime):
    """The golden script's `hpctrain launch ...` line, read back as the batch shell would, gives srun the pyxis
    options, or runs the image's Python under `apptainer exec`."""
    script = (ASSETS / "golden" / f"container-distributed-{runtime}.sh").read_text()
    line = next(ln for ln in script.splitlines() if " -m hpctrain launch " in ln)
    args = shlex.split(line.rstrip(" &"))[4:]
    env = {**os.environ, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "7"}
    out = subprocess.run([*HPCTRAIN, "launch", "--dry-run", *args], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    argv = shlex.split(out.stdout.strip().splitlines()[-1])
    shim = ["/usr/bin/python3", "-m", "hpctrain.launch.task", "--", "python", "train.py", "--config", "run 1.yaml"]
    mounts = "/shared/logs/job-42:/shared/logs/job-42,/lustre,/scratch:/scratch:rw,/datasets/imagenet:/data:ro"
    if runtime == "pyxis":
        assert argv == ["srun", "--container-image=nvcr.io#nvidia/pytorch:24.05-py3", f"--container-mounts={mounts}",
                        "--container-workdir=/home/alice/proj", "--kill-on-bad-exit=1", "--label", "--", *shim]
    else:
        assert argv == ["srun", "--kill-on-bad-exit=1", "--label", "--", "apptainer", "exec", "--nv", "--bind", mounts,
                        "--pwd=/home/alice/proj", "nvcr.io#nvidia/pytorch:24.05-py3", *shim]


def test_sinfo_states_that_rule_a_node_out():
    assert [s for s in ("allocated", "mixed", "idle", "draining", "completing") if unhealthy(s)] == []
    assert all(unhealthy(s) for s in ("down", "down*", "drained", "fail", "failing", "allocated*", "mixed*", "unknown"))


class Controller:
    """`scontrol show job` and `sinfo` as a step's restart asks them: n1 and n2 held, n1's state in turn."""

    def __init__(self, n1_states: list[str]):
        self.n1_states = n1_states

    def show_job(self, target: str) -> dict[str, str]:
        return {"NodeList": "n[1-2]"}

    def node_states(self, nodes: list[str]) -> dict[str, str]:
        state = self.n1_states.pop(0) if len(self.n1_states) > 1 else self.n1_states[0]
        return {"n1": state, "n2": "allocated"}


@pytest.mark.parametrize("n1_states, chosen, waits", [(["mixed*", "mixed*", "mixed"], ["n1", "n2"], 2),
                                                      (["mixed*"], ["n2"], 3), (["down*", "mixed"], ["n2"], 0)])
def test_a_node_that_misses_the_controllers_pings_is_asked_after_again(n1_states, chosen, waits, monkeypatch):
    """A loaded node's slurmd can miss a ping (sinfo: mixed*): the step asks again, every 2 s for up to 6 s here,
    before it gives the node up; a node down is given up at once."""
    monkeypatch.delenv("HPCTRAIN_JOURNAL_DIR", raising=False)
    env = JobEnvironment({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"})
    slept: list[float] = []
    step = step_nodes(Controller(n1_states), 2, env, silent_wait_s=6.0, sleep=slept.append)
    assert (step.chosen, slept) == (chosen, [2.0] * waits)


def test_the_step_runs_on_the_first_healthy_nodes_and_keeps_the_rest_spare():
    nodes = ["n1", "n2", "n3", "n4"]
    step = choose(nodes, nodes, {n: "allocated" for n in nodes}, {}, 2)
    assert (step.chosen, step.left_out, step.lost(), step.enough) == (["n1", "n2"], {"n3": "spare", "n4": "spare"}, {},
                                                                      True)
    # n2 left the allocation (--no-kill), n3 does not respond: n4 stands in.
    step = choose(nodes, ["n1", "n3", "n4"], {"n1": "mixed", "n3": "allocated*", "n4": "allocated"}, {}, 2)
    assert step.chosen == ["n1", "n4"] and step.lost() == {"n2": "Slurm took it out of the allocation",
                                                           "n3": "Slurm says allocated*"}
    assert step.describe() == ("on n1,n4; left out: n2 (Slurm took it out of the allocation), "
                               "n3 (Slurm says allocated*)")
    # No spare left: the layout cannot be kept.
    step = choose(nodes[:2], nodes[:2], {"n1": "allocated", "n2": "allocated"}, {"n1": "its ranks failed first in 2 steps"}, 2)
    assert not step.enough and step.describe().endswith("1 healthy nodes of the 2 the step needs")
    assert placement_options(choose(nodes, nodes, {}, {}, 2), 4) == [
        "--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--nodelist=n1,n2"]


def test_a_job_of_several_shapes_runs_on_the_largest_its_healthy_nodes_hold():
    """Shapes 4 and 2 (issue 63): of 3 nodes (Slurm's range 2-4 allocated 3) the step takes 2, the third is a
    spare; of 4 with one down, 2 again; of 1, none holds a shape."""
    nodes = ["n1", "n2", "n3", "n4"]
    up = {n: "allocated" for n in nodes}
    step = choose(nodes[:3], nodes, up, {}, [4, 2])
    assert (step.wanted, step.chosen, step.left_out, step.enough) == (2, ["n1", "n2"], {"n3": "spare"}, True)
    assert choose(nodes, nodes, up, {}, [4, 2]).chosen == nodes
    step = choose(nodes, nodes, {**up, "n2": "down"}, {}, [4, 2])
    assert (step.chosen, step.lost(), step.left_out["n4"]) == (["n1", "n3"], {"n2": "Slurm says down"}, "spare")
    step = choose(nodes[:1], nodes, up, {}, [4, 2])
    assert not step.enough and step.describe().endswith("1 healthy nodes of the 2 the step needs")


def test_rendezvous_on_the_steps_first_node():
    site = load_site("example-ib-cluster")
    env = {"SLURM_JOB_NODELIST": "gpu[017-019]", "SLURM_JOB_ID": "123"}
    assert launch_env(site, env, ["gpu018", "gpu019"])["MASTER_ADDR"] == "gpu018"


def _task_env(tmp_path, rank: int, step_restart: int = 0) -> dict[str, str]:
    return {**os.environ, "SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0",
            "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURMD_NODENAME": f"n{rank + 1}",
            "HPCTRAIN_JOB_DIR": str(tmp_path), "HPCTRAIN_JOURNAL_DIR": str(tmp_path / "journal"),
            "HPCTRAIN_STEP_RESTART": str(step_restart)}


def _shim(env: dict[str, str], code: str) -> int:
    return subprocess.run([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", code],
                          env=env).returncode


def test_the_shim_ends_as_its_entry_point_and_journals_the_first_rank_to_fail(tmp_path):
    """A rank killed by SIGKILL: its shim dies the same way and journals it, with its node; a second rank failing in
    the same step does not (srun ends it because of the first); a hung rank's exit blames no node."""
    journal = Journal(tmp_path / "journal")
    assert _shim(_task_env(tmp_path, 0), "import os, sys; sys.exit(0 if os.environ['RANK'] == '0' else 1)") == 0
    assert _shim(_task_env(tmp_path, 1), "import os, signal; os.kill(os.getpid(), signal.SIGKILL)") == -signal.SIGKILL
    assert _shim(_task_env(tmp_path, 0), "raise SystemExit(5)") == 5
    assert _shim(_task_env(tmp_path, 0, step_restart=1), f"raise SystemExit({HUNG_EXIT})") == HUNG_EXIT
    failed = [r for _, r in journal.records(kinds=("rank_failed",))]
    assert [(r["rank"], r["host"], r["exit_code"], r["message"]) for r in failed] == [
        (1, "n2", -9, "rank 1 on n2: killed by SIGKILL, the first of its job step to fail")]
    # A SIGTERM to the shim reaches the entry point, which exits 7 on it: so does the shim, and blames no node (srun
    # ending a step, a preemption or a cancel stopped it).
    code = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); print('up', flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c", code],
                            env=_task_env(tmp_path, 0, step_restart=2), stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 7  # a hang's guard: the shim's sampler thread may still be starting under load
    assert len(list(journal.records(kinds=("rank_failed",)))) == 1


def test_a_node_whose_ranks_failed_first_in_two_steps_is_excluded(tmp_path):
    journal = Journal(tmp_path / "journal")
    env = JobEnvironment({"SLURM_JOB_ID": "5", "HPCTRAIN_JOURNAL_DIR": str(journal.dir)})
    for step_restart, node, attempt in [(0, "n2", 0), (1, "n3", 0), (2, "n2", 0), (0, "n3", 1)]:
        (journal.dir).mkdir(exist_ok=True)
        (journal.dir / f"{step_restart}{node}{attempt}-rank_failed.json").write_text(
            f'{{"kind": "rank_failed", "host": "{node}", "step_restart": {step_restart}, "attempt": {attempt}, '
            f'"task_index": -1}}')
    assert excluded_nodes(journal, env, 2) == {"n2": "its ranks failed first in 2 steps"}
    assert excluded_nodes(journal, env, 3) == excluded_nodes(journal, env, 0) == {}  # retry.exclude_node_after


def test_the_peers_of_a_rank_killed_as_hung_blame_no_node(tmp_path):
    """Rank 0 on n1 is killed as hung (its log quiet past [hang] output_s); its peer on n2 then fails on the connection
    reset, before its own watchdog would end it: the hang was decided first, so no rank is the step's first failure."""
    journal = Journal(tmp_path / "journal")
    with (tmp_path / "slurm-77.out").open("w") as log:
        hung = subprocess.run([sys.executable, "-m", "hpctrain.launch.task", "--", sys.executable, "-c",
                               "import time; print('step 0', flush=True); time.sleep(3600)"],
                              env={**_task_env(tmp_path, 0), "HPCTRAIN_HANG_OUTPUT_S": "1"}, stdout=log, timeout=60)
    assert hung.returncode == HUNG_EXIT
    assert _shim(_task_env(tmp_path, 1), "raise SystemExit('RuntimeError: Connection reset by peer')") == 1
    assert list(journal.records(kinds=("rank_failed",))) == []


def test_a_step_that_hung_blames_no_node_whatever_failed_in_it(tmp_path):
    """Two hung steps whose first failures were journaled on n2 (a journal written before hangs were decided first):
    n2 is not left out; a third step in which n2's rank failed on its own counts once."""
    journal = Journal(tmp_path / "journal")
    env = JobEnvironment({"SLURM_JOB_ID": "5", "HPCTRAIN_JOURNAL_DIR": str(journal.dir)})
    journal.dir.mkdir()
    for i, (kind, step_restart) in enumerate([("rank_failed", 0), ("hang", 0), ("rank_failed", 1), ("hang", 1),
                                               ("rank_failed", 2)]):
        (journal.dir / f"{i:02d}-{kind}.json").write_text(json.dumps(
            {"kind": kind, "host": "n2", "step_restart": step_restart, "attempt": 0, "task_index": -1}))
    assert excluded_nodes(journal, env, 2) == {}
    assert excluded_nodes(journal, env, 1) == {"n2": "its ranks failed first in 1 steps"}
