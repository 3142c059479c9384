"""hpctrain launch under real sbatch/srun on the dev cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.jobs.logs import LABEL
from hpctrain.jobs.poll import Poller, job_summaries
from hpctrain.ledger import Ledger
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.states import TERMINAL
from hpctrain.submit import Submitter

from helpers.cli import run_cli
from helpers.waiting import wait_until

pytestmark = pytest.mark.slurm

PRINT_ENV = ("import json, os; print(json.dumps({k: os.environ.get(k) for k in "
             "('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT', "
             "'GLOO_SOCKET_IFNAME', 'SLURMD_NODENAME')}))")


def test_two_jobs_sharing_nodes_get_distinct_ports_and_full_rank_sets(dev_cluster, isolated_ledger):
    site = load_site("dev")
    spec = JobSpec.model_validate({"name": "rdzv", "command": ["python", "-c", PRINT_ENV],
                                   "resources": {"nodes": 2, "gpus_per_node": 2, "mem": "200M", "time": "5"},
                                   "parallel": {"dp": 4}})
    with Ledger(isolated_ledger) as ledger:
        subs = [Submitter(site, ledger).submit(spec, "<test>") for _ in range(2)]
        poller = Poller(ledger, SlurmClient.for_site(site), "dev")

        def finished():
            poller.refresh()
            rows = job_summaries(ledger, "dev")
            return rows if len(rows) == 2 and all(r["state"] in TERMINAL for r in rows) else None

        rows = wait_until(finished, 120, 1.0, "both jobs to finish")
        assert {r["state"] for r in rows} == {"COMPLETED"}
        # The launch environment reaches the ledger through each job's journal (with the batch script's
        # start and end of the run: three records per job), and each node's GPU sampler's last record (one a node:
        # the step ends within its first minute).
        out = run_cli("reconcile")
        assert out.returncode == 0 and "10 new record(s) from 2 journal(s)" in out.stdout
        assert "0 new record(s)" in run_cli("reconcile").stdout
        ports, spans = set(), []
        for sub in subs:
            job = ledger.jobs.get(sub.ledger_ids[0])
            out = (Path(job["job_dir"]) / f"slurm-{sub.slurm_ids[0]}.out").read_text()
            out = LABEL.sub("", out)  # srun --label's "3: "
            tasks = [json.loads(ln) for ln in out.splitlines() if ln.startswith("{")]
            assert sorted(int(t["RANK"]) for t in tasks) == [0, 1, 2, 3]
            assert {t["WORLD_SIZE"] for t in tasks} == {"4"} and {t["LOCAL_WORLD_SIZE"] for t in tasks} == {"2"}
            nodes = sorted(t["SLURMD_NODENAME"] for t in tasks)  # two of n1..n3, as the scheduler chose
            assert nodes[0] == nodes[1] != nodes[2] == nodes[3]
            assert {t["MASTER_ADDR"] for t in tasks} == {nodes[0]} and {t["GLOO_SOCKET_IFNAME"] for t in tasks} == {"lo"}
            ports |= {t["MASTER_PORT"] for t in tasks}
            (event,) = [e for e in ledger.events.of_job(job["id"]) if e["kind"] == "launch"]
            data = json.loads(event["data_json"])
            assert data["network_env"] == {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
            spans.append(data["master_port"])
        assert len(ports) == 2 and set(spans) == ports


def test_hostlists_expand_as_slurm_expands_them(dev_cluster):
    import subprocess

    from hpctrain.launch.rendezvous import expand_hostlist

    from helpers.cluster import HOSTLISTS

    for expr in HOSTLISTS:
        slurm = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True, check=True)
        assert expand_hostlist(expr) == slurm.stdout.split(), expr
