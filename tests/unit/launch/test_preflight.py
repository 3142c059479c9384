"""Network preflight: interface/HCA checks and NCCL transport detection (`doctor --nccl` on the dev cluster:
tests/cluster/test_preflight_cluster.py)."""

from hpctrain.launch.preflight import missing_interfaces, nccl_transport

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
