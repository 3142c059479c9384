"""hpctrain's Slurm calls replayed from outputs recorded on every supported release (22.05, 24.11,
26.05: tests/slurm_outputs/record.py, run natively and in each lane): the parsers read the same
scenario the same way whatever fields a release adds, moves or renames."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config import load_site
from hpctrain.jobs.pending import waiting
from hpctrain.runtime.requeue import job_now
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.parse import gpus_in_gres
from hpctrain.slurm.sacct import FIELDS as SACCT_FIELDS, histories
from hpctrain.slurm.version import SlurmFeatures
from hpctrain.submit.quota import JobNeeds, user_limits, verdict

RECORDINGS = sorted((Path(__file__).parent / "slurm_outputs").glob("*.json"))


class Replay(SlurmClient):
    """A SlurmClient that answers each command with what the recorded release printed at ``label``."""

    def __init__(self, recording: dict[str, Any], label: str):
        super().__init__()
        # The controller's configuration, recorded once at the end, holds at every moment.
        calls = [c for c in recording["calls"] if c["argv"] == ["scontrol", "show", "config"] or c["label"] == label]
        self.outputs = {tuple(c["argv"]): c["stdout"] for c in calls}

    def run(self, command: str, *args: str, input: str | None = None, extra_env: dict[str, str] | None = None) -> str:
        return self.outputs[(command, *args)]


@pytest.fixture(params=RECORDINGS, ids=lambda p: p.stem)
def recording(request) -> dict[str, Any]:
    return json.loads(request.param.read_text())


def test_every_supported_release_is_recorded():
    assert [p.stem for p in RECORDINGS] == ["22.05", "24.11", "26.05"]


def test_a_running_job_after_one_preemption(recording):
    jobs, client = recording["jobs"], Replay(recording, "running")
    now = job_now(client, {"SLURM_JOB_ID": jobs["low"]})
    assert now is not None and (now.state, now.restarts, now.preempted) == ("RUNNING", 1, False)
    assert now.end_time is not None  # start + the 5-minute limit
    found = histories(client.sacct(list(jobs.values()), SACCT_FIELDS))
    low = found[jobs["low"]][-1]
    assert [a.state for a in low.attempts] == ["PREEMPTED", "RUNNING"] and low.restarts == 1
    assert low.attempts[0].gpus == 6 and low.attempts[0].end is not None
    # The throttled array, whatever pending-range rows sacct adds: six tasks, none restarted.
    array = found[jobs["array"]]
    assert sorted(array) == list(range(6)) and all(h.restarts == 0 for h in array.values())
    assert {h.state for h in array.values()} <= {"PENDING", "RUNNING", "COMPLETED"}
    states = {r["JobID"]: r["State"] for r in client.squeue_states(list(jobs.values()))}
    assert states[jobs["low"]] == "RUNNING" and states[f"{jobs['array']}_0"] in ("RUNNING", "COMPLETED")


def test_the_scenario_once_every_job_ended(recording):
    jobs, client = recording["jobs"], Replay(recording, "done")
    found = histories(client.sacct(list(jobs.values()), SACCT_FIELDS))
    # 24.11 ran the job a third time: Slurm recorded its completed second run as PREEMPTED (2 recordings of 2).
    extra = ["PREEMPTED"] if recording["release"].startswith("24.11.") else []
    assert [a.state for a in found[jobs["low"]][-1].attempts] == ["PREEMPTED", *extra, "COMPLETED"]
    assert found[jobs["high"]][-1].state == "COMPLETED"
    array = found[jobs["array"]]
    assert sorted(array) == list(range(6))
    assert all(h.restarts == 0 and h.state == "COMPLETED" and h.attempts[0].gpus == 1 for h in array.values())


def test_config_partitions_nodes_shares_and_qos(recording):
    client = Replay(recording, "done")
    features = SlurmFeatures.from_config(client.config())
    assert str(features.version) == recording["release"]
    assert client.config()["ClusterName"] == "dev"
    assert {p["PartitionName"] for p in client.show("partition")} == {"gpu", "debug"}
    assert {n["NodeName"]: gpus_in_gres(n["Gres"]) for n in client.show("node")} == {"n1": 4, "n2": 4, "n3": 4}
    shares = {(r["Account"].strip(), r["User"]) for r in client.sshare("root")}
    assert {("teama", "root"), ("teamb", "root")} <= shares
    qos = {q["name"]: q for q in client.sacctmgr("qos", fields="name,priority,preempt,preemptmode,gracetime")}
    assert qos["high"]["preempt"] == "low" and qos["low"]["preemptmode"] == "requeue"


def test_jobs_waiting_behind_limits_and_for_other_reasons(recording):
    """The quota reads and the waiting jobs' reasons, as every release prints them: the same limits and the
    same sentences, with the numbers of the limit behind each."""
    jobs, client = recording["limit_jobs"], Replay(recording, "limits")
    limits = user_limits(load_site("dev"), client, "root")
    cap = next(lim for lim in limits if lim.scope == "account teamb" and lim.slurm_name == "GrpTRES:gres/gpu")
    assert (cap.limit, cap.used, cap.left) == (8, 8, 0)
    assert {(lim.scope, lim.slurm_name, lim.limit) for lim in limits} >= {
        ("account teama", "GrpTRESMins:gres/gpu", 10_000_000), ("QOS normal per user", "MaxTRESPU:gres/gpu", 12),
        ("QOS normal per user", "MaxSubmitJobsPU", 20_000), ("QOS low", "MaxWallPJ", 1440)}
    per_user = next(lim for lim in limits if lim.slurm_name == "MaxTRESPU:gres/gpu")
    assert per_user.used == 8  # root's GPUs running in QOS normal: the holding job's
    # The ledger may still hold a job as pending that has started: squeue lists only what waits.
    rows = [{"id": n, "slurm_job_id": slurm_id, "state": "PENDING", "account": "teamb" if name == "behind" else "teama",
             "qos": "high" if name == "wide" else "normal"} for n, (name, slurm_id) in enumerate(jobs.items())]
    reasons = {"behind": "AssocGrpGRES", "held": "JobHeldUser", "begin": "BeginTime", "per_user": "QOSMaxGRESPerUser",
               "wide": "Resources", "after": "Dependency"}
    sentences = {
        "behind": "its account's running-GPU cap is reached: account teamb, 8 of 8 GPUs in use",
        "held": "held by its user: `scontrol release` it",
        "begin": "it may not start before its begin time (Slurm's delay after a requeue, or --begin)",
        "per_user": "your running-GPU cap in its QOS is reached: QOS normal per user, 8 of 12 GPUs in use",
        "wide": "it is next, waiting for nodes with the GPUs, CPUs and memory it asks to free up",
        "after": "it waits for the jobs it depends on to end"}
    waiting_jobs = [name for name in jobs if name != "hold"]
    assert client.pending_reasons([r["slurm_job_id"] for r in rows]) == {jobs[n]: reasons[n] for n in waiting_jobs}
    assert waiting(rows, client, lambda: limits) == {r["id"]: sentences[name] for r, name in zip(rows, jobs)
                                                     if name != "hold"}
