"""Record what hpctrain's own Slurm calls print on a dev cluster, for the parser tests (test_slurm_outputs.py).

    scripts/dev-cluster up && .venv/bin/python tests/assets/slurm_outputs/record.py
    scripts/slurm-lane 26.05 run bash -c 'scripts/dev-cluster up && .venv/bin/python tests/assets/slurm_outputs/record.py'

The scenario: a job in QOS low preempted once by a high job (so it has two runs; it outlasts the QOS
grace time, which 22.05 would not requeue it after), and a throttled array (6 tasks, %2); then jobs
waiting for every reason hpctrain words (`waiting_jobs`): behind teamb's running-GPU cap (8, set by
scripts/dev-cluster) while one job holds it, behind QOS normal's per-user cap, held, for a begin time, on
dependencies, on partition limits and a reservation, behind each limit of temporary accounts and QOS, with
the quota reads of `hpctrain quota`; then jobs queued behind a job that fills the cluster and one for a
drained node. Every call goes through SlurmClient's own methods (and the compute side's job_now), so the
recording holds exactly the commands hpctrain runs, under a label for the moment of the scenario.
Writes tests/assets/slurm_outputs/<release>.json.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from hpctrain.config import load_site
from hpctrain.runtime.requeue import job_now
from hpctrain.slurm.client import SlurmClient
from hpctrain.slurm.parse import parse_kv_lines
from hpctrain.slurm.sacct import FIELDS as SACCT_FIELDS
from hpctrain.submit.quota import user_limits

HERE = Path(__file__).resolve().parent


class Recorder(SlurmClient):
    """A SlurmClient that keeps every command's output under the current label."""

    def __init__(self) -> None:
        super().__init__()
        self.label = ""
        self.recorded: list[dict[str, Any]] = []

    def run(self, command: str, *args: str, input: str | None = None, extra_env: dict[str, str] | None = None) -> str:
        out = super().run(command, *args, input=input, extra_env=extra_env)
        if self.label:
            self.recorded.append({"label": self.label, "argv": [command, *args], "stdout": out})
        return out


def sbatch(*args: str) -> str:
    done = subprocess.run(["sbatch", "--parsable", "--account=teama", "--time=5", "--output=/dev/null", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.strip().split(";")[0]


def job(client: SlurmClient, job_id: str) -> dict[str, str]:
    (record,) = parse_kv_lines(client.run("scontrol", "-o", "show", "job", job_id))
    return record


def until(predicate, what: str, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


# Temporary accounts and QOS, each with a limit no job of the scenario fits: name -> the limit.
ACCOUNT_LIMITS = {"grp_jobs": "GrpJobs=0", "budget": "GrpTRESMins=gres/gpu=0", "wall": "MaxWall=10",
                  "per_job": "MaxTRES=gres/gpu=1"}
QOS_LIMITS = {"grp_gpus": "GrpTRES=gres/gpu=0", "grp_jobs": "GrpJobs=0", "budget": "GrpTRESMins=gres/gpu=0",
              "user_jobs": "MaxJobsPerUser=0", "wall": "MaxWall=10", "per_job": "MaxTRESPerJob=gres/gpu=1"}


def sacctmgr(*args: str, check: bool = True) -> None:
    subprocess.run(["sacctmgr", "-i", *args], capture_output=True, text=True, check=check)


def scontrol(*args: str, check: bool = True) -> None:
    subprocess.run(["scontrol", *args], capture_output=True, text=True, check=check)


def set_up() -> None:
    """The temporary limits (one on an account above the user's), partitions and reservation the waiting jobs meet."""
    for name, limit in ACCOUNT_LIMITS.items():
        sacctmgr("add", "account", f"rec_{name}", "parent=root")
        sacctmgr("add", "user", "root", f"account=rec_{name}")
        sacctmgr("modify", "account", f"rec_{name}", "set", limit)
    sacctmgr("add", "account", "rec_user_jobs", "parent=root")
    sacctmgr("add", "user", "root", "account=rec_user_jobs", "MaxJobs=0")
    # A cap on an account above the user's (read with one more assoc_mgr call, for the level between).
    sacctmgr("add", "account", "rec_dept", "parent=root", "GrpTRES=gres/gpu=6")
    sacctmgr("add", "account", "rec_team", "parent=rec_dept")
    sacctmgr("add", "user", "root", "account=rec_team")
    for name, limit in QOS_LIMITS.items():
        sacctmgr("add", "qos", f"rec_{name}", limit)
    sacctmgr("modify", "user", "root", "where", "account=teama", "set", f"qos+={','.join('rec_' + n for n in QOS_LIMITS)}")
    scontrol("create", "PartitionName=rec_small", "Nodes=n3", "MaxTime=10", "MaxNodes=1", "State=UP")
    scontrol("create", "PartitionName=rec_down", "Nodes=n3", "State=DOWN")
    scontrol("create", "reservation", "ReservationName=rec_later", "StartTime=now+3600", "Duration=10", "Nodes=n3",
             "Users=root")


def undo() -> None:
    """Everything set_up made, and every job, gone (whatever failed on the way)."""
    subprocess.run(["scancel", "-u", "root"], check=False)
    scontrol("update", "NodeName=n3", "State=RESUME", check=False)
    scontrol("delete", "ReservationName=rec_later", check=False)
    for partition in ("rec_small", "rec_down"):
        scontrol("delete", f"PartitionName={partition}", check=False)
    accounts = ",".join(f"rec_{n}" for n in [*ACCOUNT_LIMITS, "user_jobs", "team"])
    sacctmgr("delete", "user", "root", "where", f"account={accounts}", check=False)
    sacctmgr("delete", "account", accounts, check=False)
    sacctmgr("delete", "account", "rec_dept", check=False)  # once its child is gone
    sacctmgr("delete", "qos", ",".join(f"rec_{n}" for n in QOS_LIMITS), check=False)


def record_waiting(rec: Recorder, label: str, waiting: dict[str, str], others: list[str]) -> None:
    """Under ``label``, why each of ``waiting`` waits (once each has a reason), asked with ``others``."""
    ids = list(waiting.values())
    until(lambda: len([r for r in rec.pending_reasons(ids).values() if r not in ("", "None")]) == len(ids),
          f"every waiting job's reason ({label})")
    rec.label = label
    rec.pending_reasons([*others, *ids])
    rec.label = ""


def waiting_jobs(rec: Recorder) -> dict[str, dict[str, str]]:
    """Jobs waiting for every reason hpctrain words, in three scenes: behind limits checked before nodes
    are picked while one job holds n1 and n2 (label "limits", with the quota reads of `hpctrain quota`);
    behind limits checked once nodes are picked, on an idle cluster (label "select": with no node free
    they wait for "Priority" instead); queued behind a job that fills n1 and n2 while n3 is drained
    (label "queue"). Label -> name -> job id, in the order squeue was asked."""
    hold = sbatch("--account=teamb", "-J", "rec-hold", "-N2", "-w", "n[1-2]", "--gres=gpu:4", "--wrap", "sleep 120")
    until(lambda: job(rec, hold)["JobState"] == "RUNNING", "the job holding teamb's GPUs")
    failed = sbatch("--wrap", "false")
    set_up()
    small = ("-N1", "--gres=gpu:2", "--time=20", "--wrap", "sleep 1")  # over every per-job limit of set_up
    limits = {
        "behind": sbatch("--account=teamb", *small),
        "held": sbatch("--hold", *small),
        "begin": sbatch("--begin=now+3600", *small),
        "per_user": sbatch("-N2", "-w", "n[1-2]", "--gres=gpu:3", "--wrap", "sleep 1"),  # 8 + 6 > 12
        "after": sbatch(f"--dependency=afterok:{hold}", "--wrap", "sleep 1"),
        "admin_held": sbatch(*small),
        "reservation": sbatch("--reservation=rec_later", "--time=5", "--wrap", "sleep 1"),
        **{f"account_{n}": sbatch(f"--account=rec_{n}", *small) for n in ("grp_jobs", "user_jobs", "wall")},
        **{f"qos_{n}": sbatch(f"--qos=rec_{n}", *small) for n in ("grp_jobs", "user_jobs", "wall")},
    }
    scontrol("hold", limits["admin_held"])
    until(lambda: job(rec, failed)["JobState"] == "FAILED", "the job that fails")
    limits["never"] = sbatch(f"--dependency=afterok:{failed}", "--wrap", "sleep 1")
    record_waiting(rec, "limits", limits, [hold])
    rec.label = "limits"
    user_limits(load_site("dev"), rec, "root")
    rec.label = ""
    subprocess.run(["scancel", hold, *limits.values()], check=True)

    select = {
        "partition_time": sbatch("-p", "rec_small", *small),
        "partition_nodes": sbatch("-p", "rec_small", "-N2", "--wrap", "sleep 1"),
        "partition_down": sbatch("-p", "rec_down", *small),
        **{f"account_{n}": sbatch(f"--account=rec_{n}", *small) for n in ("budget", "per_job")},
        **{f"qos_{n}": sbatch(f"--qos=rec_{n}", *small) for n in ("grp_gpus", "budget", "per_job")},
    }
    record_waiting(rec, "select", select, [])
    subprocess.run(["scancel", *select.values()], check=True)

    scontrol("update", "NodeName=n3", "State=DRAIN", "Reason=recording")
    full = sbatch("-J", "rec-full", "-N2", "-w", "n[1-2]", "--gres=gpu:4", "--wrap", "sleep 120")
    until(lambda: job(rec, full)["JobState"] == "RUNNING", "the job filling n1 and n2")
    queue = {"wide": sbatch("--qos=high", "-N2", "--gres=gpu:4", "--wrap", "sleep 1")}
    queue["next"] = sbatch("--qos=high", "-N2", "--gres=gpu:4", "--wrap", "sleep 1")
    queue["drained"] = sbatch("-w", "n3", *small)
    record_waiting(rec, "queue", queue, [full])
    return {"limits": {"hold": hold, **limits}, "select": select, "queue": {"full": full, **queue}}


def main() -> None:
    rec = Recorder()
    release = rec.version()
    # Half of every node's GPUs: the high job (all of them) preempts it, the array runs beside it.
    low = sbatch("--qos=low", "--requeue", "-J", "rec-low", "-N3", "--gres=gpu:2", "--wrap", "sleep 30")
    until(lambda: job(rec, low)["JobState"] == "RUNNING", "the low job to run")
    high = sbatch("--qos=high", "-J", "rec-high", "-N3", "--gres=gpu:4", "--wrap", "sleep 2")
    until(lambda: (j := job(rec, low))["JobState"] == "RUNNING" and j["Restarts"] == "1", "the low job's second run")
    array = sbatch("--array=0-5%2", "-J", "rec-array", "-N1", "--gres=gpu:1", "--wrap", "sleep 3")
    until(lambda: job(rec, f"{array}_1")["JobState"] == "RUNNING", "the array's first tasks")
    until(lambda: any(r["JobID"].startswith(f"{array}_") for r in rec.sacct([array], SACCT_FIELDS)), "accounting")
    ids = [low, high, array]

    rec.label = "running"
    job_now(rec, {"SLURM_JOB_ID": low})
    rec.sacct(ids, SACCT_FIELDS)
    rec.squeue_states(ids)
    rec.label = ""
    until(lambda: not rec.squeue_states(ids) or all(r["State"] == "COMPLETED" for r in rec.squeue_states(ids)),
          "every job to end")
    time.sleep(3)  # accounting lags the controller
    rec.label = "done"
    rec.sacct(ids, SACCT_FIELDS)
    rec.config()
    rec.show("partition")
    rec.show("node")
    rec.sshare("root")
    rec.sacctmgr("qos", fields="name,priority,preempt,preemptmode,gracetime")

    rec.label = ""
    try:
        scenes = waiting_jobs(rec)
    finally:
        undo()

    out = HERE / f"{release.major}.{release.minor:02d}.json"
    out.write_text(json.dumps({"release": str(release), "jobs": {"low": low, "high": high, "array": array},
                               "scenes": scenes,
                               "calls": rec.recorded}, indent=1) + "\n")
    print(f"wrote {out.relative_to(HERE.parents[2])}: {len(rec.recorded)} outputs of Slurm {release}")


if __name__ == "__main__":
    main()
