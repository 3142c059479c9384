"""hpctrain's Slurm calls replayed from outputs recorded on every supported release (22.05, 24.11,
26.05: tests/assets/slurm_outputs/record.py, run natively and in each lane): the parsers read the same
scenario the same way whatever fields a release adds, moves or renames."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpctrain.config import load_site
from hpctrain.jobs.pending import SENTENCES, reason_key, waiting
from hpctrain.runtime.requeue import job_now
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.parse import gpus_in_gres
from hpctrain.slurm.sacct import FIELDS as SACCT_FIELDS, histories
from hpctrain.slurm.version import SlurmFeatures
from hpctrain.submit.quota import user_limits

from helpers.paths import ASSETS

RECORDINGS = sorted((ASSETS / "slurm_outputs").glob("*.json"))


class Replay(SlurmClient):
    """A SlurmClient that answers each command with what the recorded release printed at ``label``."""

    def __init__(self, recording: dict[str, Any], label: str):
        super().__init__()
        # The controller's configuration, recorded once at the end, holds at every moment.
        calls = [c for c in recording["calls"] if c["argv"] == ["scontrol", "show", "config"] or c["label"] == label]
        self.outputs = {tuple(c["argv"]): c["stdout"] for c in calls}

    def run(self, command: str, *args: str, input: str | None = None, extra_env: dict[str, str] | None = None) -> str:
        if (command, *args) in self.outputs:
            return self.outputs[(command, *args)]
        return self._reordered(command, args)

    def _reordered(self, command: str, args: tuple[str, ...]) -> str:
        """A `--format` asking the recorded fields in another order: sacct prints its columns in the order asked,
        so the recorded answer with its columns moved, by their names, is the answer."""
        [asked] = [a for a in args if a.startswith("--format=")]
        fields = asked.split("=", 1)[1].split(",")
        for key, stdout in self.outputs.items():
            recorded = [a for a in key[1:] if a.startswith("--format=")]
            if key[0] != command or [a for a in key[1:] if a not in recorded] != [a for a in args if a != asked]:
                continue
            if recorded and sorted(had := recorded[0].split("=", 1)[1].split(",")) == sorted(fields):
                order = [had.index(f) for f in fields]
                return "".join("|".join(line.split("|")[i] for i in order) + "\n" for line in stdout.splitlines() if line)
        raise KeyError((command, *args))


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


def test_the_quota_reads_with_jobs_waiting(recording):
    """`hpctrain quota`'s reads while one job holds teamb's GPUs, as every release prints them, the accounts above
    the user's included."""
    limits = user_limits(load_site("dev"), Replay(recording, "limits"), "root")
    cap = next(lim for lim in limits if lim.scope == "account teamb" and lim.slurm_name == "GrpTRES:gres/gpu")
    assert (cap.limit, cap.used, cap.left) == (8, 8, 0)
    assert {(lim.scope, lim.slurm_name, lim.limit) for lim in limits} >= {
        ("account teama", "GrpTRESMins:gres/gpu", 10_000_000), ("QOS normal per user", "MaxTRESPU:gres/gpu", 12),
        ("QOS normal per user", "MaxSubmitJobsPU", 20_000), ("QOS low", "MaxWallPJ", 1440)}
    per_user = next(lim for lim in limits if lim.slurm_name == "MaxTRESPU:gres/gpu" and lim.scope == "QOS normal per user")
    assert per_user.used == 8  # root's GPUs running in QOS normal: the holding job's
    # rec_dept's cap, read with one more call for the account above rec_team, holds for rec_team alone.
    dept = [(lim.slurm_name, lim.limit, lim.covers) for lim in limits if lim.scope == "account rec_dept"]
    assert dept == [("GrpTRES:gres/gpu", 6, ("rec_team",))]


# The recordings' waiting jobs, scene by scene (record.py's waiting_jobs): the reason every release gives
# each (what a release adds after a comma, such as the nodes, varies) and hpctrain's sentence for it, with the
# numbers of the limit behind it.
WAITS = {
    "limits": {
        "behind": ("AssocGrpGRES", "its account's running-GPU cap is reached: account teamb, 8 of 8 GPUs in use"),
        "held": ("JobHeldUser", "held by its user: `scontrol release` it"),
        "begin": ("BeginTime", "it may not start before its begin time (Slurm's delay after a requeue, or --begin)"),
        "per_user": ("QOSMaxGRESPerUser",
                     "your running-GPU cap in its QOS is reached: QOS normal per user, 8 of 12 GPUs in use"),
        "after": ("Dependency", "it waits for the jobs it depends on to end"),
        "admin_held": ("JobHeldAdmin", "held by an administrator"),
        "reservation": ("Reservation", "it waits for its reservation to start"),
        "account_grp_jobs": ("AssocGrpJobsLimit",
                             "its account's running-job cap is reached: account rec_grp_jobs, 0 of 0 jobs in use"),
        "account_user_jobs": ("AssocMaxJobsLimit",
                              "your running-job cap in its account is reached: rec_user_jobs/root, 0 of 0 jobs in use"),
        "account_wall": ("AssocMaxWallDurationPerJobLimit",
                         "its time limit is above its account's per-job cap: rec_wall/root, 10 minutes per job"),
        "qos_grp_jobs": ("QOSGrpJobsLimit", "its QOS's running-job cap is reached: QOS rec_grp_jobs, 0 of 0 jobs in use"),
        "qos_user_jobs": ("QOSMaxJobsPerUserLimit",
                          "your running-job cap in its QOS is reached: QOS rec_user_jobs per user, 0 of 0 jobs in use"),
        "qos_wall": ("QOSMaxWallDurationPerJobLimit",
                     "its time limit is above its QOS's per-job cap: QOS rec_wall, 10 minutes per job"),
        "never": ("DependencyNeverSatisfied", "its dependency can never be met (a job it needs failed): cancel it"),
    },
    "select": {
        "partition_time": ("PartitionTimeLimit", "its time limit is above the partition's"),
        "partition_nodes": ("PartitionNodeLimit", "it asks more nodes than the partition allows"),
        "partition_down": ("PartitionDown", "its partition is down"),
        "account_budget": ("AssocGrpGRESMinutes",
                           "its account's GPU-minute budget is spent: account rec_budget, 0 of 0 GPU-minutes spent"),
        "account_per_job": ("AssocMaxGRESPerJob",
                            "it asks more GPUs than its account allows a job: rec_per_job/root, 1 GPUs per job"),
        "qos_grp_gpus": ("QOSGrpGRES", "its QOS's running-GPU cap is reached: QOS rec_grp_gpus, 0 of 0 GPUs in use"),
        "qos_budget": ("QOSGrpGRESMinutes",
                       "its QOS's GPU-minute budget is spent: QOS rec_budget, 0 of 0 GPU-minutes spent"),
        "qos_per_job": ("QOSMaxGRESPerJob", "it asks more GPUs than its QOS allows a job: QOS rec_per_job, 1 GPUs per job"),
    },
    "queue": {
        "wide": ("Resources", "it is next, waiting for nodes with the GPUs, CPUs and memory it asks to free up"),
        "next": ("Priority", "other jobs of higher priority are ahead of it (fairshare, QOS, age)"),
        "drained": ("ReqNodeNotAvail", "a node it needs is down, drained or reserved"),
    },
}


def account_and_qos(name: str) -> tuple[str, str]:
    """The account and QOS record.py submits a waiting job of that name under."""
    if name.startswith("account_"):
        return f"rec_{name.removeprefix('account_')}", "normal"
    if name.startswith("qos_"):
        return "teama", f"rec_{name.removeprefix('qos_')}"
    return "teamb" if name in ("hold", "behind") else "teama", "high" if name in ("wide", "next") else "normal"


def test_every_reason_hpctrain_words_is_recorded():
    """hpctrain words no reason it has not seen a release give (any other is quoted as Slurm says it)."""
    assert {reason for scene in WAITS.values() for reason, _ in scene.values()} == set(SENTENCES)


@pytest.mark.parametrize("scene", WAITS)
def test_why_jobs_wait(recording, scene):
    """Each waiting job's reason as the release gives it, in words, with the numbers of the limit behind it.
    The ledger may still hold a job as pending that has started (the scene's first): squeue lists only what waits."""
    jobs, client = recording["scenes"][scene], Replay(recording, scene)
    limits = user_limits(load_site("dev"), Replay(recording, "limits"), "root")
    rows = [{"id": name, "slurm_job_id": slurm_id, "state": "PENDING", "account": account_and_qos(name)[0],
             "qos": account_and_qos(name)[1]} for name, slurm_id in jobs.items()]
    reasons = {name: client.pending_reasons(list(jobs.values())).get(slurm_id) for name, slurm_id in jobs.items()}
    assert {name: reason and reason_key(reason) for name, reason in reasons.items()} == {
        name: WAITS[scene][name][0] if name in WAITS[scene] else None for name in jobs}
    detail = {name: f" ({reason.partition(', ')[2]})" if ", " in reason else "" for name, reason in reasons.items() if reason}
    assert waiting(rows, client, lambda: limits) == {name: sentence + detail[name]
                                                     for name, (_, sentence) in WAITS[scene].items()}
