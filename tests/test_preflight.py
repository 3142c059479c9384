"""Network preflight: interface/HCA checks, NCCL transport detection, and `doctor --nccl` on the dev cluster."""

import json

import pytest

from hpctrain.launch.preflight import missing_interfaces, nccl_transport

from conftest import REPO, run_cli

# Recorded from NCCL 2.21 with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET.
NCCL_IB = """gpu017:1234:1280 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB ib0:10.1.0.17<0>
gpu017:1234:1280 [0] NCCL INFO Using network IB
gpu017:1234:1290 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0"""
NCCL_SOCKET = """gpu017:1234:1280 [0] NCCL INFO NET/IB : No device found.
gpu017:1234:1280 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.17<0>
gpu017:1234:1290 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0"""


def test_transport_from_nccl_log():
    assert nccl_transport(NCCL_IB) == "ib"
    assert nccl_transport(NCCL_SOCKET) == "socket"
    assert nccl_transport("") == "unknown"


def test_missing_interfaces_and_hcas(tmp_path):
    (tmp_path / "net" / "ib0").mkdir(parents=True)
    (tmp_path / "net" / "eth0").mkdir()
    (tmp_path / "ib" / "mlx5_0").mkdir(parents=True)
    env = {"NCCL_SOCKET_IFNAME": "ib,eth", "NCCL_IB_HCA": "mlx5_0:1,mlx5_1", "GLOO_SOCKET_IFNAME": "enp"}
    assert missing_interfaces(env, str(tmp_path / "net"), str(tmp_path / "ib")) == [
        "GLOO_SOCKET_IFNAME: no interface 'enp'", "NCCL_IB_HCA: no HCA 'mlx5_1'"]


@pytest.mark.slurm
def test_doctor_nccl_on_dev_cluster(dev_cluster, tmp_path):
    out = run_cli("doctor", "--nccl", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert checks["network n1"]["detail"].startswith("no CUDA here: gloo all-reduce ok across 2 nodes (sum 2)")
    assert checks["network n2"]["verdict"] == "PASS"
    site = tmp_path / "site.toml"
    text = (REPO / "site_configs" / "dev.toml").read_text()
    site.write_text(text.replace('[network_env]\n', '[network_env]\nNCCL_SOCKET_IFNAME = "ib0"\nNCCL_IB_HCA = "mlx5_0"\n'))
    out = run_cli("doctor", "--site", str(site), "--nccl", "--json")
    assert out.returncode == 1
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert checks["network n1"] == {"name": "network n1", "verdict": "FAIL",
                                    "detail": "NCCL_SOCKET_IFNAME: no interface 'ib0'; NCCL_IB_HCA: no HCA 'mlx5_0'"}
