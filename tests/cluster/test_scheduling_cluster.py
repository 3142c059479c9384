"""Fairshare-aware account choice, QOS preemption with requeue, and dependencies, on the live dev cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.errors import ConfigError
from hpctrain.jobs.poll import Poller, job_summaries
from hpctrain.ledger import Ledger
from hpctrain.slurm import SlurmClient
from hpctrain.submit import Submitter
from hpctrain.submit.placement import choose_placement, fairshare_standings

from helpers.cli import run_cli
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
