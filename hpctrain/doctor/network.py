"""The network, by a job: `hpctrain doctor --nccl` runs hpctrain.launch.preflight on one task per node and judges
its report (NCCL transport, all-reduce bus bandwidth against the partition's fabric)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hpctrain.config.job import JobSpec
from hpctrain.config.site import SiteConfig
from hpctrain.contract import JobPaths
from hpctrain.doctor.cluster import Check, Verdict
from hpctrain.errors import HpctrainError
from hpctrain.jobs.logs import LABEL
from hpctrain.jobs.poll import wait_finished
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit import Submitter

FABRIC_WARN_SHARE = 0.5  # warn when the measured bus bandwidth is under this share of fabric_gb_s


def network_checks(site: SiteConfig, ledger: Ledger, client: SlurmClient, partition: str, nodes: int) -> list[Check]:
    """Run hpctrain.launch.preflight as one task per node on ``partition``, submitted through the same templates
    as every job (and recorded like one), and judge its report."""
    part = site.partitions.get(partition)
    if part is None:
        return [Check("network", "FAIL", f"partition {partition!r} is not in the site config")]
    spec = JobSpec.model_validate(
        {
            "name": "hpctrain-preflight",
            "requeue": False,
            "command": [str(site.launch.python or sys.executable), "-m", "hpctrain.launch.preflight"],
            "resources": {
                "nodes": nodes,
                "tasks_per_node": 1,
                "gpus_per_node": 1 if part.gpus_per_node else 0,
                "time": 300,
                "partition": partition,
            },
        }
    )
    try:
        sub = Submitter(site, ledger, client).submit(spec, "<hpctrain doctor --nccl>")
        state = wait_finished(ledger, client, site.name, sub.ledger_ids)[sub.ledger_ids[0]]
    except HpctrainError as exc:
        return [Check("network", "FAIL", f"preflight job failed: {exc}")]
    job_dir = ledger.jobs.known(sub.ledger_ids[0])["job_dir"]
    assert job_dir is not None  # recorded before its sbatch
    output = JobPaths(Path(job_dir)).output(sub.slurm_ids[0])
    try:
        lines = LABEL.sub("", output.read_text()).splitlines()  # each task's lines start "<rank>: " (srun --label)
    except OSError as exc:
        return [Check("network", "FAIL", f"preflight job {sub.slurm_ids[0]} ended {state}: {exc.strerror}: {output}")]
    reports = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("PREFLIGHT ")]
    if len(reports) != nodes:
        return [
            Check(
                "network",
                "FAIL",
                f"{len(reports)} of {nodes} nodes reported, job {sub.slurm_ids[0]} ended {state} (log: {output})",
            )
        ]
    checks = []
    ib_configured = bool(site.network_env.get("NCCL_IB_HCA"))
    reports.sort(key=lambda r: r["rank"])
    for r in reports:
        name = f"network {r['node']}"
        if r.get("error"):
            checks.append(Check(name, "FAIL", f"all-reduce failed: {r['error']}"))
        elif r["missing"]:
            checks.append(Check(name, "FAIL", "; ".join(r["missing"])))
        elif r["backend"] == "nccl" and ib_configured and r.get("transport") != "ib":
            checks.append(
                Check(name, "FAIL", f"NCCL used {r.get('transport')}, not InfiniBand, although NCCL_IB_HCA is set")
            )
        elif r["backend"] == "nccl":
            checks.append(Check(name, "PASS", f"NCCL all-reduce over {r.get('transport')} across {nodes} nodes"))
        else:
            checks.append(
                Check(
                    name,
                    "PASS",
                    f"no CUDA here: gloo all-reduce ok across {nodes} nodes (sum {r['sum']}); "
                    "NCCL transport not checked",
                )
            )
    measured = next((r for r in reports if r.get("bandwidth")), None)  # every rank reports the same figures
    if measured:
        checks.append(bandwidth_check(measured["backend"], measured["bandwidth"], part.fabric_gb_s, partition))
    return checks


def bandwidth_check(backend: str, sizes: list[dict], fabric_gb_s: float | None, partition: str) -> Check:
    """Judge the bus bandwidth of the largest all-reduce the preflight timed against the partition's fabric_gb_s."""
    largest = max(sizes, key=lambda s: s["bytes"])
    busbw, ranks = largest["busbw_gb_s"], largest["ranks"]
    what = f"{backend} all-reduce of {largest['bytes'] / 2**20:g} MiB across {ranks} ranks"
    if ranks < 2:
        return Check("network bandwidth", "SKIP", f"{what}: one rank crosses no fabric")
    measured = f"bus bandwidth {busbw:.3g} GB/s"
    if fabric_gb_s is None:
        return Check(
            "network bandwidth",
            "PASS",
            f"{measured} ({what}); set partitions.{partition}.fabric_gb_s to compare it with the fabric",
        )
    share = busbw / fabric_gb_s
    verdict: Verdict = "PASS" if share >= FABRIC_WARN_SHARE else "WARN"
    return Check(
        "network bandwidth", verdict, f"{measured}, {100 * share:.0f} % of the fabric's {fabric_gb_s:g} GB/s ({what})"
    )
