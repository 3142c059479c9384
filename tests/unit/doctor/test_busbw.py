"""All-reduce bus bandwidth of `hpctrain doctor --nccl`: nccl-tests' arithmetic, the verdict against the site's
fabric_gb_s, and the preflight's measurement by two gloo processes on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpctrain.doctor.cluster import Check
from hpctrain.doctor.network import bandwidth_check
from hpctrain.launch.preflight import GLOO_SIZES, bus_bandwidth

from helpers.paths import REPO
from helpers.rendezvous import agent_store


def test_bus_bandwidth_is_nccl_tests_definition():
    assert bus_bandwidth(1 << 30, 0.5, 8) == (2 * 2**30, 2 * 2**30 * 2 * 7 / 8)
    assert bus_bandwidth(1000, 1e-3, 2) == pytest.approx((1e6, 1e6))  # two ranks: busbw = algbw
    assert bus_bandwidth(1000, 1e-3, 1) == (pytest.approx(1e6), 0.0)  # one rank moves nothing over a link


def sizes(busbw_gb_s: float, ranks: int = 4) -> list[dict]:
    small = {"bytes": 1 << 20, "ranks": ranks, "seconds": 1.0, "algbw_gb_s": 1.0, "busbw_gb_s": 1.0}
    return [small, {**small, "bytes": 256 << 20, "busbw_gb_s": busbw_gb_s}]


def test_largest_size_is_judged_against_the_fabric():
    assert bandwidth_check("nccl", sizes(40.0), 50.0, "h100") == Check(
        "network bandwidth", "PASS", "bus bandwidth 40 GB/s, 80 % of the fabric's 50 GB/s "
                                     "(nccl all-reduce of 256 MiB across 4 ranks)")
    assert bandwidth_check("nccl", sizes(12.0), 50.0, "h100").verdict == "WARN"
    unjudged = bandwidth_check("gloo", sizes(12.0), None, "cpu")
    assert unjudged.verdict == "PASS" and "set partitions.cpu.fabric_gb_s" in unjudged.detail
    assert bandwidth_check("nccl", sizes(0.0, ranks=1), 50.0, "h100").verdict == "SKIP"


def test_preflight_measures_bus_bandwidth_with_two_gloo_ranks():
    store, meet = agent_store()
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    base.update(meet, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", SLURM_NTASKS="2",
                SLURM_TASKS_PER_NODE="2", SLURM_NODEID="0")
    procs = [subprocess.Popen([sys.executable, "-m", "hpctrain.launch.preflight"], cwd=REPO, text=True,
                              env={**base, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for rank in range(2)]
    outputs = [proc.communicate(timeout=300) for proc in procs]
    reports = [json.loads(line.removeprefix("PREFLIGHT ")) for out, _ in outputs for line in out.splitlines()
               if line.startswith("PREFLIGHT ")]
    assert len(reports) == 2 and not any("error" in r for r in reports), outputs
    assert reports[0]["bandwidth"] == reports[1]["bandwidth"]  # the slowest rank's time, shared by all
    measured = reports[0]["bandwidth"]
    assert [m["bytes"] for m in measured] == list(GLOO_SIZES)
    for m in measured:
        assert m["ranks"] == 2 and m["seconds"] > 0
        assert m["algbw_gb_s"] == pytest.approx(m["bytes"] / m["seconds"] / 1e9)
        assert m["busbw_gb_s"] == pytest.approx(m["algbw_gb_s"] * 2 * (2 - 1) / 2)
    check = bandwidth_check(reports[0]["backend"], measured, None, "gpu")
    assert check.verdict == "PASS" and check.detail.startswith("bus bandwidth "), check


@pytest.mark.timeout(90)  # without the preflight's own bound a task waited for its peer for torch's 30 minutes
def test_a_task_whose_peer_never_comes_gives_up_after_the_preflights_timeout(monkeypatch):
    from hpctrain.launch import preflight

    store, meet = agent_store()
    for name, value in dict(meet, RANK="0", LOCAL_RANK="0", WORLD_SIZE="2", CUDA_VISIBLE_DEVICES="").items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(preflight, "PEERS_TIMEOUT_S", 3)
    with pytest.raises(Exception, match="(?i)time"):
        preflight.all_reduce_check()
