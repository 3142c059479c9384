"""Record what hpctrain's own Slurm calls print on a dev cluster, for the parser tests (test_slurm_outputs.py).

    scripts/dev-cluster up && .venv/bin/python tests/slurm_outputs/record.py
    scripts/slurm-lane 26.05 run bash -c 'scripts/dev-cluster up && .venv/bin/python tests/slurm_outputs/record.py'

The scenario: a job in QOS low preempted once by a high job (so it has two runs; it outlasts the QOS
grace time, which 22.05 would not requeue it after), and a throttled array
(6 tasks, %2); then, while one job holds teamb's running-GPU cap (8, set by scripts/dev-cluster), jobs
waiting behind that cap, held, for a begin time, behind QOS normal's per-user GPU cap and on a dependency,
with the quota reads of `hpctrain quota`. (The 22.05 and 26.05 recordings also hold a QOS high job waiting
for resources; on 24.11 such a job makes the jobs below it wait for "Priority", hiding their limits.) Every call goes through SlurmClient's own methods (and the compute side's job_now), so
the recording holds exactly the commands hpctrain runs, under a label for the moment of the scenario.
Writes tests/slurm_outputs/<release>.json.
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


def main() -> None:
    rec = Recorder()
    release = rec.version()
    # Half of every node's GPUs: the high job (all of them) preempts it, the array runs beside it.
    low = sbatch("--qos=low", "--requeue", "-J", "rec-low", "-N3", "--gres=gpu:2", "--wrap", "sleep 30")
    until(lambda: job(rec, low)["JobState"] == "RUNNING", "the low job to run")
    high = sbatch("--qos=high", "-J", "rec-high", "-N3", "--gres=gpu:4", "--wrap", "sleep 2")
    until(lambda: job(rec, low)["JobState"] == "RUNNING" and job(rec, low)["Restarts"] == "1", "the low job's second run")
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
    # Jobs waiting for every reason hpctrain words, while one holds teamb's 8 GPUs (n1, n2) in QOS normal.
    hold = sbatch("--account=teamb", "-J", "rec-hold", "-N2", "--gres=gpu:4", "--wrap", "sleep 120")
    until(lambda: job(rec, hold)["JobState"] == "RUNNING", "the job holding teamb's GPUs")
    waiting = {
        "behind": sbatch("--account=teamb", "-J", "rec-behind", "-N1", "--gres=gpu:1", "--wrap", "sleep 1"),
        "held": sbatch("--hold", "-J", "rec-held", "-N1", "--gres=gpu:1", "--wrap", "sleep 1"),
        "begin": sbatch("--begin=now+3600", "-J", "rec-begin", "-N1", "--gres=gpu:1", "--wrap", "sleep 1"),
        "per_user": sbatch("-J", "rec-per-user", "-N3", "--gres=gpu:2", "--wrap", "sleep 1"),  # 8 + 6 > 12
    }
    waiting["after"] = sbatch(f"--dependency=afterok:{waiting['held']}", "-J", "rec-after", "--wrap", "sleep 1")
    ids = [hold, *waiting.values()]
    until(lambda: len([r for r in rec.pending_reasons(ids).values() if r not in ("", "None")]) == len(waiting),
          "every waiting job's reason")
    rec.label = "limits"
    rec.pending_reasons(ids)
    user_limits(load_site("dev"), rec, "root")
    rec.label = ""
    subprocess.run(["scancel", *ids], check=True)

    out = HERE / f"{release.major}.{release.minor:02d}.json"
    out.write_text(json.dumps({"release": str(release), "jobs": {"low": low, "high": high, "array": array},
                               "limit_jobs": {"hold": hold, **waiting},
                               "calls": rec.recorded}, indent=1) + "\n")
    print(f"wrote {out.relative_to(HERE.parent.parent)}: {len(rec.recorded)} outputs of Slurm {release}")


if __name__ == "__main__":
    main()
