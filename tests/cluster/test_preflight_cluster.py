"""`hpctrain doctor --nccl` on the dev cluster: the network preflight across its nodes (the checks themselves:
tests/unit/launch/test_preflight.py)."""

import json

import pytest

from helpers.cli import run_cli
from helpers.lanes import lanes
from helpers.paths import REPO

pytestmark = pytest.mark.slurm


@lanes(why="a torch.distributed check in an srun step, alike on every release")
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
