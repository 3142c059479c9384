"""Fairshare-aware account choice, QOS preemption with requeue, and dependencies, on the live dev cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.config.job import JobSpec
from hpctrain.errors import ConfigError
from hpctrain.jobs.poll import Poller, job_summaries
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.parse import parse_kv_line
from hpctrain.slurm.states import TERMINAL
from hpctrain.submit import Submitter
from hpctrain.submit.placement import choose_placement, fairshare_standings

from helpers.cli import run_cli
from helpers.cluster import RACER, finish
from helpers.train import TINY_MODEL, patched_trainer, reference_losses, relative_errors
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

WHOLE_CLUSTER = {"nodes": 3, "gpus_per_node": 4, "tasks_per_node": 1, "cpus_per_task": 16, "mem": "1G", "time": "10"}


def submit(ledger_path, data: dict):
    with Ledger(ledger_path) as ledger:
        return Submitter(load_site("dev"), ledger).submit(JobSpec.model_validate(data), "<test>")


def test_auto_account_moves_to_the_account_with_better_fairshare(dev_cluster, isolated_ledger):
    client = SlurmClient()

    def teama_usage() -> int:
        return next(int(r["RawUsage"]) for r in client.sshare("root") if r["Account"] == "teama" and not r["User"])

    before = teama_usage()
    # Usage on teama far above anything teamb has: 48 CPUs for 12 s.
    submit(isolated_ledger, {"name": "burn", "command": ["sleep", "12"], "launcher": "none",
                             "resources": {**WHOLE_CLUSTER, "account": "teama"}})

    def teamb_ahead():
        # Usage is folded into sshare every PriorityCalcPeriod (1 min here).
        s = fairshare_standings(client, "root")
        return teama_usage() >= before + 400 and s["teamb"].key() > s["teama"].key()

    wait_until(teamb_ahead, 150, 3.0, "sshare to rank teamb above teama after usage on teama")
    spec = JobSpec.model_validate({"name": "auto", "command": ["true"], "resources": {"account": "auto"}})
    placement = choose_placement(spec, load_site("dev"), client, "root", "<test>")
    assert placement.account == "teamb"
    assert placement.reason.startswith("auto: best fairshare teamb (user FairShare ")
    assert " over teama (user FairShare " in placement.reason
    sub = submit(isolated_ledger, {"name": "auto", "command": ["true"], "launcher": "none",
                                   "resources": {"account": "auto", "mem": "100M", "time": "5"}})
    with Ledger(isolated_ledger) as ledger:
        row = ledger.jobs.get(sub.ledger_ids[0])
        (event,) = [e for e in ledger.events.of_job(row["id"]) if e["kind"] == "placement"]
    assert row["account"] == "teamb"
    assert row["choice_reason"].startswith("auto: best fairshare teamb (") and " over teama (" in row["choice_reason"]
    assert event["message"] == row["choice_reason"]


def test_low_qos_job_is_requeued_by_a_high_job_and_status_shows_it(dev_cluster, isolated_ledger):
    # The step ignores the USR2 notice, so the job lives until Slurm's SIGTERM after the grace time.
    low = submit(isolated_ledger, {"name": "scavenger", "launcher": "none",
                                   "command": ["bash", "-c", "trap '' USR2; exec sleep 600"],
                                   "resources": {**WHOLE_CLUSTER, "preemptible": True, "account": "teama"}})
    poller_site = load_site("dev")
    with Ledger(isolated_ledger) as ledger:
        poller = Poller(ledger, SlurmClient.for_site(poller_site), "dev")

        def running():
            poller.refresh()
            return ledger.jobs.get(low.ledger_ids[0])["state"] == "RUNNING"

        wait_until(running, 60, 1.0, "the low job to start")
        assert ledger.jobs.get(low.ledger_ids[0])["qos"] == "low"
    submit(isolated_ledger, {"name": "urgent", "command": ["sleep", "1"], "launcher": "none",
                             "resources": {"nodes": 1, "gpus_per_node": 4, "tasks_per_node": 1, "cpus_per_task": 16, "mem": "1G",
                                           "time": "5", "qos": "high", "account": "teama"}})

    def requeued():
        out = run_cli("status", "--all", "--json")
        rows = {r["name"]: r for r in json.loads(out.stdout)}
        return rows if rows["scavenger"]["restarts"] >= 1 and rows["scavenger"]["preemptions"] >= 1 else None

    rows = wait_until(requeued, 120, 2.0, "the low job to be preempted and requeued")
    assert rows["scavenger"]["state"] in ("REQUEUED", "PENDING", "RUNNING")
    shown = json.loads(run_cli("show", str(low.ledger_ids[0]), "--json").stdout)
    assert [a["state"] for a in shown["attempts"]][0] == "PREEMPTED"
    assert run_cli("cancel", str(low.ledger_ids[0])).returncode == 0


def test_afterok_dependency_waits_given_slurm_or_ledger_ids(dev_cluster, isolated_ledger):
    """A dependency on a Slurm id (a TOML integer) or on a ledger id (a string), which submit turns into Slurm ids;
    a ledger id that is not in the ledger is one line naming the key."""
    quick = {"launcher": "none", "resources": {"mem": "100M", "time": "5"}}
    first = submit(isolated_ledger, {"name": "first", "command": ["sleep", "3"], **quick})
    second = submit(isolated_ledger, {"name": "second", "command": ["true"], **quick,
                                      "dependency": {"after": [int(first.slurm_ids[0])], "kind": "afterok"}})
    third = submit(isolated_ledger, {"name": "third", "command": ["true"], **quick,
                                     "dependency": {"after_jobs": [str(first.ledger_ids[0])], "kind": "afterok"}})
    with pytest.raises(ConfigError, match=r"^<test>: dependency\.after_jobs\[0\]: ledger job 99 is not in the ledger$"):
        submit(isolated_ledger, {"name": "fourth", "command": ["true"], **quick, "dependency": {"after_jobs": [99]}})
    with Ledger(isolated_ledger) as ledger:
        poller = Poller(ledger, SlurmClient(), "dev")

        def all_done():
            poller.refresh()
            rows = {r["name"]: r for r in job_summaries(ledger, "dev")}
            return rows if {r["state"] for r in rows.values()} == {"COMPLETED"} else None

        rows = wait_until(all_done, 90, 1.0, "the jobs to complete")
        script = Path(ledger.jobs.get(third.ledger_ids[0])["script_path"]).read_text()
    assert f"#SBATCH --dependency=afterok:{first.slurm_ids[0]}\n" in script
    assert rows["second"]["started_at"] >= rows["first"]["ended_at"]
    assert rows["third"]["started_at"] >= rows["first"]["ended_at"]
    assert second.slurm_ids != first.slurm_ids


SOON = """name = "soon"
command = ["sleep", "1"]
launcher = "none"
[resources]
nodes = {nodes}
gpus_per_node = 4
cpus_per_task = 1
mem = "1G"
time = "00:10:00"
account = "{account}"
"""


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


PARTITION_NODES = {"gpu": "n[1-3]", "debug": "n[1-2]"}


@contextmanager
def held_by_another_account(**held: tuple[str, int]) -> Iterator[None]:
    """Each partition named narrowed to one node for the test (``gpu=("n3", 60)``), which a job of teamb holds for
    that many minutes by its time limit (teamb's cap is 8 GPUs: two nodes); the others stay as they are."""
    jobs: list[str] = []
    try:
        for partition, (node, minutes) in held.items():
            slurm("scontrol", "update", f"PartitionName={partition}", f"Nodes={node}")
        yield from teamb_running(jobs, [(partition, node, minutes) for partition, (node, minutes) in held.items()])
    finally:
        for partition in held:
            slurm("scontrol", "update", f"PartitionName={partition}", f"Nodes={PARTITION_NODES[partition]}")


def teamb_running(jobs: list[str], holds: list[tuple[str, str, int]]) -> Iterator[None]:
    """A job of teamb on each (partition, node, minutes by its time limit) of ``holds``, running, its id added to
    ``jobs``; yields once all run and cancels them after."""
    try:
        for partition, node, minutes in holds:
            jobs.append(slurm("sbatch", "--parsable", "-o", "/dev/null", "-p", partition, "-A", "teamb", "-w", node,
                              "--gres=gpu:4", "-t", str(minutes), "--wrap", "sleep 900"))  # its log: not here
        for job in jobs:
            wait_until(lambda: slurm("squeue", "-h", "-j", job, "-o", "%T") == "RUNNING", 60, what="teamb's job")
        yield
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], capture_output=True)


def gpu_partition_held_by_another_account():
    """Partition gpu narrowed to n3 for the test, which an hour-long job of teamb holds; debug (n1, n2) stays free."""
    return held_by_another_account(gpu=("n3", 60))


def test_where_ranks_the_free_partition_first_and_submit_soonest_starts_there(dev_cluster, isolated_ledger, tmp_path):
    """Issue 63: the spec's own partition (gpu) is held by another account's long job while debug is free."""
    spec = tmp_path / "soon.toml"
    spec.write_text(SOON.format(nodes=1, account="teama"))
    with gpu_partition_held_by_another_account():
        shown = run_cli("where", str(spec), "--json")
        assert shown.returncode == 0, shown.stderr
        ranked, now = json.loads(shown.stdout)["candidates"], time.time()
        assert [(c["partition"], c["account"]) for c in ranked] == [("debug", "teama"), ("gpu", "teama")], shown.stdout
        assert ranked[0]["start"] <= now and ranked[0]["basis"].startswith("Slurm: free now")
        assert ranked[1]["start"] > now + 50 * 60 and ranked[1]["nodes"] == "n3"  # once teamb's hour is over
        table = run_cli("where", str(spec)).stdout
        assert table.index("debug/normal") < table.index("gpu/normal") and "Slurm: free now" in table
        out = run_cli("submit", "--soonest", str(spec), "--json")
        assert out.returncode == 0, out.stderr
        submitted = json.loads(out.stdout)
        assert submitted["partition"] == "debug"
        assert submitted["reason"].startswith("soonest: debug/normal as teama now (Slurm: free now) over gpu/normal")
        slurm_id = submitted["slurm_ids"][0]
        def started() -> str | None:  # the controller's view: accounting may lag behind
            job = parse_kv_line(slurm("scontrol", "-o", "show", "job", slurm_id))
            return job["NodeList"] if job["JobState"] in ("RUNNING", "COMPLETING", "COMPLETED") else None

        # Within one poll of `status --watch` (10 s): it started on a node of debug.
        assert wait_until(started, 10, what="the job to start") in ("n1", "n2")
        assert "soonest: debug/normal" in run_cli("show", str(submitted["ledger_ids"][0])).stdout
        # Its start now tells how far off the prediction was: the next ranking says so.
        assert run_cli("status").returncode == 0
        errors = json.loads(run_cli("where", str(spec), "--json").stdout)["errors"]
        assert errors["jobs"] == 1 and errors["predicted_s"] < 30 and errors["slurm_s"] < 30
        # Two hours, or runs of 30 minutes: debug (at most an hour a job) holds only the runs, which start now.
        chunked = tmp_path / "chunked.toml"
        chunked.write_text(SOON.format(nodes=1, account="teama").replace('"00:10:00"', '["02:00:00", "00:30:00"]'))
        shown = json.loads(run_cli("where", str(chunked), "--json").stdout)
        assert [(c["partition"], c["chunk_s"]) for c in shown["candidates"]][0] == ("debug", 1800), shown
        assert "partition debug: resources.time: 02:00:00 requested, partition 'debug' allows 01:00:00" in (
            shown["left_out"])
        assert "runs of 00:30:00" in run_cli("where", str(chunked)).stdout  # the table's time limit column
        out = run_cli("submit", "--soonest", str(chunked), "--json")
        assert out.returncode == 0, out.stderr
        submitted = json.loads(out.stdout)
        assert (submitted["partition"], submitted["time_s"]) == ("debug", 1800)
        assert " in runs of 00:30:00 now " in submitted["reason"]
        assert slurm("squeue", "-h", "-j", submitted["slurm_ids"][0], "-o", "%l") == "30:00"


@contextmanager
def normal_qos_full_for_the_user() -> Iterator[None]:
    """QOS normal capped at 4 running GPUs a user for the test, which a long job of the user's own holds: a job in
    normal pends (QOSMaxGRESPerUser) though nodes are free, which `sbatch --test-only` does not see."""
    slurm("sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set", "MaxTRESPerUser=gres/gpu=4")
    held = None
    try:
        held = slurm("sbatch", "--parsable", "-o", "/dev/null", "-p", "gpu", "-A", "teama", "-q", "normal",
                     "--gres=gpu:4", "-t", "60", "--wrap", "sleep 900")
        wait_until(lambda: slurm("squeue", "-h", "-j", held, "-o", "%T") == "RUNNING", 60, what="the user's job to run")
        yield
    finally:
        if held:
            subprocess.run(["scancel", held], capture_output=True)
        slurm("sacctmgr", "-i", "modify", "qos", "where", "name=normal", "set", "MaxTRESPerUser=gres/gpu=12")


def test_a_spec_that_allows_preemption_starts_in_the_preemptible_qos_when_normal_waits(dev_cluster, isolated_ledger,
                                                                                      tmp_path):
    """Issue 63, QOS as a choice: `preemptible = "allowed"` ranks the site's preemptible QOS beside its own. Slurm
    says "now" for both; the quota verdict knows normal waits for the user's running-GPU cap."""
    spec = tmp_path / "soon.toml"
    spec.write_text(SOON.format(nodes=1, account="teama") + 'preemptible = "allowed"\n')
    with normal_qos_full_for_the_user():
        shown = run_cli("where", str(spec), "--json")
        assert shown.returncode == 0, shown.stderr
        ranked = json.loads(shown.stdout)["candidates"]
        assert [(c["partition"], c["qos"]) for c in ranked] == [
            ("gpu", "low"), ("debug", "low"), ("gpu", "normal"), ("debug", "normal")], shown.stdout
        assert all(c["start"] is None and c["slurm_start"] <= time.time() for c in ranked[2:])
        assert ranked[2]["basis"].startswith("waits for a limit: QOS normal per user's running GPUs")
        assert "after a limit" in run_cli("where", str(spec)).stdout
        out = run_cli("submit", "--soonest", str(spec), "--json")
        assert out.returncode == 0, out.stderr
        submitted = json.loads(out.stdout)
        slurm_id = submitted["slurm_ids"][0]
        assert (submitted["partition"], submitted["qos"]) == ("gpu", "low"), submitted
        assert wait_until(lambda: slurm("squeue", "-h", "-j", slurm_id, "-o", "%T") in ("RUNNING", "COMPLETING", ""),
                          10, what="the job to start")


def test_enough_past_waits_that_disagree_with_slurm_change_where_it_ranks(dev_cluster, isolated_ledger, tmp_path):
    """Issue 63: debug and gpu both held by teamb, debug for 40 minutes and gpu for 60 by their time limits, so
    Slurm ranks debug first. Twenty of the user's jobs alike in gpu started a minute after submission (the jobs
    ahead ended early, as most do): the ledger's history puts gpu first, and says so."""
    spec = tmp_path / "soon.toml"
    spec.write_text(SOON.format(nodes=1, account="teama"))
    with held_by_another_account(debug=("n1", 40), gpu=("n3", 60)):
        first = json.loads(run_cli("where", str(spec), "--json").stdout)["candidates"]
        assert [c["partition"] for c in first] == ["debug", "gpu"], first
        assert first[0]["basis"].startswith("Slurm: in ") and "no job alike" in first[1]["basis"]
        with Ledger(isolated_ledger) as ledger:
            jobs, now = Table(ledger, "jobs"), time.time()
            for k in range(20):
                job = jobs.insert({"name": "alike", "site": "dev", "state": "COMPLETED", "partition": "gpu",
                                   "account": "teama", "qos": "normal", "submitted_at": now - 3600 * (k + 1),
                                   "is_array": 0})
                ledger.attempts.record(job, -1, 0, started_at=now - 3600 * (k + 1) + 60, alloc_gpus=4)
        ranked = json.loads(run_cli("where", str(spec), "--json").stdout)["candidates"]
    assert [c["partition"] for c in ranked] == ["gpu", "debug"], ranked
    gpu, debug = ranked
    assert gpu["basis"].startswith("history (80% history): Slurm in ")
    assert gpu["basis"].endswith("; 20 job(s) alike waited 1 min (median)")
    assert gpu["slurm_start"] > debug["slurm_start"] and gpu["start"] < debug["start"]


# The trainer on 2 nodes or 1 (one rank a node; the fake GPUs make the job hold each node's GPUs, as teamb's do).
SHAPED = """name = "shaped"
command = ["python", "-c", {command}]
seed = 7
hyperparameters = {{ lr = 1e-3 }}
[resources]
nodes = [2, 1]
gpus_per_node = 4
tasks_per_node = 1
mem = "2G"
time = "00:10:00"
account = "teama"
[parallel]
dp = 2
micro_batch = 2
[model]
{model}
[checkpoint]
dir = "{checkpoints}"
every_steps = 20
"""
SHAPED_STEPS = 40


def test_a_spec_of_two_shapes_starts_on_the_one_free_and_resumes_on_both_after_a_requeue(dev_cluster, isolated_ledger,
                                                                                        tmp_path):
    """Issue 63, shapes: `nodes = [2, 1]` while teamb holds n1 and n3: `where` ranks one node now before two later,
    `submit --soonest` starts the trainer on one node (dp 1, grad_accum 2). Stopped and requeued once n3 is free, it
    resumes on two (dp 2, grad_accum 1) from the checkpoint of its stop, and its losses are a single process's to
    the resharded resume's tolerance. Its first run sleeps 0.2 s a step, so the stop comes before its end."""
    slow = patched_trainer(SHAPED_STEPS, 'if os.environ.get("SLURM_RESTART_COUNT", "0") == "0": time.sleep(0.2)')
    spec = tmp_path / "shaped.toml"
    spec.write_text(SHAPED.format(command=json.dumps(slow), checkpoints=tmp_path / "ck",
                                  model="\n".join(f"{k} = {v}" for k, v in TINY_MODEL.items())))
    holds: list[str] = []
    with contextmanager(teamb_running)(holds, [("gpu", "n1", 60), ("gpu", "n3", 60)]):
        ranked = json.loads(run_cli("where", str(spec), "--json").stdout)["candidates"]
        assert [(c["partition"], c["shape"]) for c in ranked][:2] == [("gpu", 1), ("debug", 1)], ranked
        assert {(c["partition"], c["shape"]) for c in ranked[2:]} == {("gpu", 2), ("debug", 2)}
        assert ranked[0]["start"] <= time.time() and ranked[0]["nodes"] == "n2"
        # two nodes wait for teamb's hour, or for QOS normal's 12 GPUs a user (root holds teamb's 8 here)
        assert all(c["start"] is None or c["start"] > time.time() + 50 * 60 for c in ranked[2:]), ranked
        assert "nodes" in run_cli("where", str(spec)).stdout.splitlines()[2]  # the table's shape column
        assert "#SBATCH --nodes=1-2\n" in run_cli("submit", "--dry-run", str(spec)).stdout
        out = run_cli("submit", "--soonest", str(spec), "--json")
        assert out.returncode == 0, out.stderr
        submitted = json.loads(out.stdout)
        assert (submitted["partition"], submitted["nodes"]) == ("gpu", 1)
        assert " on 1 node(s) now " in submitted["reason"]
        with Ledger(isolated_ledger) as ledger:
            job = ledger.jobs.get(submitted["ledger_ids"][0])
            journal = Journal(Path(job["job_dir"]) / "journal")
            wait_until(lambda: [r for _, r in journal.records(kinds=["metrics"]) if r["step"] >= 2], 300, 0.5,
                       "the first run's second step")
            SlurmClient().scancel([job["slurm_job_id"]], signal="TERM", batch_only=True)
            subprocess.run(["scancel", holds[1]], check=True)  # n3 is free before the requeued run may start
            assert finish(ledger, job["id"], timeout=600) == "COMPLETED"
    launches = [r["nodes"] for _, r in journal.records(kinds=["launch"])]
    [requeue] = [r for _, r in journal.records(kinds=["requeue"])]
    assert launches == ["n2", "n2,n3"] and 2 <= requeue["step"] < SHAPED_STEPS, (launches, requeue)
    losses = {r["step"]: r["values"]["loss"] for _, r in journal.records(kinds=["metrics"])}
    assert sorted(losses) == list(range(1, SHAPED_STEPS + 1))
    want = reference_losses(load_job_spec(spec), SHAPED_STEPS)
    assert max(relative_errors([losses[s] for s in sorted(losses)], want)) <= 1e-5


@pytest.mark.parametrize(("nodes", "account", "said"), [
    (4, "teama", "partition gpu: resources.nodes: 4 nodes requested, partition 'gpu' has 3; partition debug: "
                 "resources.nodes: 4 nodes requested, partition 'debug' has 2"),
    (1, "nosuch", "gpu as nosuch: resources.account: user 'root' has no association with account 'nosuch' (has: "),
    (3, "teamb", "gpu as teamb: resources.account: the job can never start as 'teamb': account teamb allows 8 "
                 "running GPUs; the job asks 12 GPUs; partition debug: resources.nodes: 3 nodes requested, "
                 "partition 'debug' has 2"),
], ids=["a shape no partition holds", "an account the user lacks", "every candidate over quota"])
def test_where_and_submit_soonest_refuse_in_one_line_and_submit_nothing(dev_cluster, isolated_ledger, tmp_path,
                                                                       nodes, account, said):
    spec = tmp_path / "soon.toml"
    spec.write_text(SOON.format(nodes=nodes, account=account))
    for argv in (["where", str(spec)], ["submit", "--soonest", str(spec)]):
        out = run_cli(*argv)
        assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out.stderr
        assert out.stderr.startswith(f"hpctrain: error: {spec}: no placement can run it: {said}"), out.stderr
    with Ledger(isolated_ledger) as ledger:
        assert Table(ledger, "jobs").rows() == []


# The acceptance's 50 races on the host, 10 on each lane (CI time), run 10 at a time.
RACES, AT_ONCE = (10, 10) if os.environ.get("HPCTRAIN_LANE") else (50, 10)


def test_races_of_two_placements_run_the_command_once_and_cancel_the_other(dev_cluster, isolated_ledger, tmp_path):
    """Issue 63: `submit --race 2` over debug and gpu, ten races at a time so that runners start together: each
    race runs the command exactly once, and its other runner is cancelled, never started or stopped before the
    command. A reconcile loop beside the test's own polls cancels losers too, as cron's would."""
    from hpctrain.jobs.poll import Poller
    from hpctrain.submit.racing import submit_race
    from hpctrain.submit.soonest import rank

    site, client = load_site("dev"), SlurmClient()
    spec_path = tmp_path / "racer.toml"
    cron = subprocess.Popen(["bash", "-c", f"while true; do {sys.executable} -m hpctrain reconcile; sleep 1; done"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for first in range(0, RACES, AT_ONCE):
            races = {}
            with Ledger(isolated_ledger) as ledger:
                for k in range(first, first + AT_ONCE):
                    spec_path.write_text(RACER.format(ran=str(tmp_path / f"ran-{k}")))
                    spec = load_job_spec(spec_path)
                    ranking = rank(spec, site, client, "root", str(spec_path), ledger, fresh=True)
                    subs, left_out = submit_race([Submitter(site, ledger, client)], spec, str(spec_path), ranking, 2)
                    assert left_out == [] and sorted(s.placement.partition for s in subs) == ["debug", "gpu"]
                    races[k] = {s.ledger_ids[0]: s.slurm_ids[0] for s in subs}

                def ended() -> dict[str, str] | None:
                    Poller(ledger, client, "dev").refresh()
                    ids = [i for pair in races.values() for i in pair.values()]
                    rows = slurm("sacct", "-X", "-n", "-P", "-o", "JobID,State", "-j", ",".join(ids))
                    states = {i: s.split()[0] for i, s in (line.split("|")[:2] for line in rows.splitlines())}
                    return states if len(states) == len(ids) and set(states.values()) <= TERMINAL else None

                states = wait_until(ended, 120, interval=1, what=f"races {first}-{first + AT_ONCE - 1} to end")
            for k, pair in races.items():
                ran = [int(i) for i in (tmp_path / f"ran-{k}").read_text().split()] if (
                    tmp_path / f"ran-{k}").exists() else []
                assert len(ran) == 1 and ran[0] in pair, (k, ran, {i: states[i] for i in pair.values()})
                [loser] = [slurm_id for runner, slurm_id in pair.items() if runner != ran[0]]
                assert (states[pair[ran[0]]], states[loser]) == ("COMPLETED", "CANCELLED"), (k, states)
    finally:
        os.killpg(cron.pid, signal.SIGTERM)
        cron.wait()
    shown = json.loads(run_cli("status", "--all", "--json", "--limit", str(2 * RACES)).stdout)
    assert len(shown) == RACES and {r["state"] for r in shown} == {"COMPLETED"}


def killed_at(nth: int, when: str) -> str:
    """A hook for a submitting process: its ``nth`` sbatch call dies (os._exit, as cron's `timeout` kills) just
    ``before`` it or ``after`` it returned (before the ledger has the id), or is ``slow`` (3 s, while reconciles
    run beside it)."""
    return textwrap.dedent(f"""
        import os, sys, time
        from hpctrain.cli import main
        from hpctrain.slurm.client import SlurmClient
        calls, old = [], SlurmClient.sbatch
        def sbatch(*args, **kwargs):
            calls.append(1)
            mine = len(calls) == {nth}
            if mine and {when!r} == "before":
                os._exit(9)
            if mine and {when!r} == "slow":
                time.sleep(3)
            out = old(*args, **kwargs)
            if mine and {when!r} == "after":
                os._exit(9)
            return out
        SlurmClient.sbatch = sbatch
        sys.argv = ["hpctrain", "submit", *sys.argv[1:]]
        main()
    """)


# (a submission, the sbatch call that dies or is slow, how): what one clean run of each gives, once settled.
UNSENT = {
    "plain, before its sbatch": ([], 1, "before"),  # never reached Slurm: SUBMIT_FAILED, nothing runs
    "plain, after its sbatch": ([], 1, "after"),  # found by its comment: runs once
    "plain, slow beside reconciles": ([], 1, "slow"),  # alive: its row is never settled by another process
    "race, after the first runner's sbatch": (["--race", "2"], 1, "after"),  # a race of one
    "race, before the second runner's sbatch": (["--race", "2"], 2, "before"),
    "race, after the second runner's sbatch": (["--race", "2"], 2, "after"),
}


def test_a_submission_killed_at_any_step_is_settled_and_runs_at_most_once(dev_cluster, isolated_ledger, tmp_path):
    """`submit` and `submit --race 2` killed before or after an sbatch, with reconciles from cron beside them: each
    killed submission's rows are settled by the next reconcile (found by their sbatch comment, else failed), never
    while their submitter lives, and each command runs exactly once where Slurm took a runner, else never."""
    cron = subprocess.Popen(["bash", "-c", f"while true; do {sys.executable} -m hpctrain reconcile; sleep 0.3; done"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for k, (how, (argv, nth, when)) in enumerate(UNSENT.items()):
            spec = tmp_path / f"unsent-{k}.toml"
            spec.write_text(RACER.format(ran=str(tmp_path / f"ran-{k}")))
            died = subprocess.run([sys.executable, "-c", killed_at(nth, when), *argv, str(spec)],
                                  capture_output=True, text=True)
            assert died.returncode == (0 if when == "slow" else 9), (how, died.stderr)
    finally:
        os.killpg(cron.pid, signal.SIGTERM)
        cron.wait()
    settled = run_cli("reconcile")
    assert settled.returncode == 0, settled.stderr

    def ended() -> list[dict] | None:
        with Ledger(isolated_ledger) as ledger:
            Poller(ledger, SlurmClient(), "dev").refresh()
            rows = Table(ledger, "jobs").rows()
        return rows if {r["state"] for r in rows} <= TERMINAL | {"SUBMIT_FAILED"} else None

    rows = wait_until(ended, 120, interval=1, what="every submission to end")
    with Ledger(isolated_ledger) as ledger:
        failed_once = {j["id"] for j in rows
                       if any(e["kind"] == "submit_failed" for e in ledger.events.of_job(j["id"]))}
    assert failed_once == {j["id"] for j in rows if j["state"] == "SUBMIT_FAILED"}  # none decided twice
    by_spec = {}
    for r in rows:
        by_spec.setdefault(json.loads(r["spec_json"])["command"][-1], []).append(r)
    for k, (how, (argv, nth, when)) in enumerate(UNSENT.items()):
        ran_file = tmp_path / f"ran-{k}"
        ran = ran_file.read_text().split() if ran_file.exists() else []
        [jobs] = [v for cmd, v in by_spec.items() if str(ran_file) in cmd]
        states = sorted(j["state"] for j in jobs)
        if how == "plain, before its sbatch":
            assert (ran, states) == ([], ["SUBMIT_FAILED"]), how
            assert jobs[0]["error"] == "its submitter was killed before Slurm took it"
            continue
        assert len(ran) == 1 and int(ran[0]) in {j["id"] for j in jobs if j["slurm_job_id"]}, (how, ran, jobs)
        expected = {"plain, after its sbatch": ["COMPLETED"], "plain, slow beside reconciles": ["COMPLETED"],
                    "race, after the first runner's sbatch": ["COMPLETED"],
                    "race, before the second runner's sbatch": ["COMPLETED", "SUBMIT_FAILED"],
                    "race, after the second runner's sbatch": ["CANCELLED", "COMPLETED"]}[how]
        assert states == expected, (how, jobs)
