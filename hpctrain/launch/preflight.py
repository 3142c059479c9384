"""Network preflight, run as one task per node by `hpctrain doctor --nccl`.

Each task checks that the interfaces and HCAs the site config names exist on its node, then all
tasks run one tiny all-reduce: over NCCL where CUDA is present (reading NCCL's own log to see
whether it used InfiniBand or fell back to sockets), else over gloo. Then they time all-reduces of
a few sizes for the bus bandwidth, as nccl-tests defines it. It reports what it saw; it does not
guess.

    srun -N2 --ntasks-per-node=1 python -m hpctrain.launch.preflight
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.contract import JobEnvironment
from hpctrain.launch.rendezvous import task_env

if TYPE_CHECKING:
    import torch

MiB = 1 << 20
NCCL_SIZES = tuple(MiB << 2 * i for i in range(5))  # 1 .. 256 MiB: the largest near the fabric's peak
GLOO_SIZES = (MiB, 4 * MiB, 16 * MiB)  # gloo runs on the CPU: smaller, to keep the job short
# How long a task waits for its peers (rendezvous, each collective): past it, a task whose peer is gone reports the
# error and ends instead of holding the allocation (each task exits 0, so srun never ends the others for it).
PEERS_TIMEOUT_S = 120
WARMUP, ITERATIONS = 2, 10


def missing_interfaces(
    env: dict[str, str], net_dir: str = "/sys/class/net", ib_dir: str = "/sys/class/infiniband"
) -> list[str]:
    """Names in NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME / NCCL_IB_HCA that this node does not have."""
    problems = []
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        for name in filter(None, env.get(var, "").lstrip("=^").split(",")):
            prefix_ok = any(n.startswith(name) for n in os.listdir(net_dir)) if os.path.isdir(net_dir) else False
            if not prefix_ok:
                problems.append(f"{var}: no interface {name!r}")
    hcas = [h.split(":")[0] for h in env.get("NCCL_IB_HCA", "").lstrip("=^").split(",") if h]
    for hca in hcas:
        if not os.path.isdir(os.path.join(ib_dir, hca)):
            problems.append(f"NCCL_IB_HCA: no HCA {hca!r}")
    return problems


def nccl_transport(log_text: str) -> str:
    """'ib', 'socket' or 'unknown' from NCCL INFO lines such as 'NET/IB : Using [0]mlx5_0:1/IB'."""
    if re.search(r"NET/IB\b.*Using", log_text) or "via NET/IB" in log_text:
        return "ib"
    if re.search(r"NET/Socket\b.*Using", log_text) or "via NET/Socket" in log_text:
        return "socket"
    return "unknown"


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s of an all-reduce of ``nbytes`` per rank that took ``seconds`` across ``ranks``.

    nccl-tests' definitions: algbw = size / time; busbw = algbw * 2 (n - 1) / n, the rate each rank's
    link carries in a ring all-reduce, comparable with the hardware's bandwidth (0 for one rank).
    """
    algbw = nbytes / seconds
    return algbw, algbw * 2 * (ranks - 1) / ranks


def all_reduce_bandwidth(sizes: Sequence[int], device: torch.device) -> list[dict[str, float]]:
    """Time all-reduces of float32 tensors of each size (bytes) in the initialised default group.

    The time of a size is the slowest rank's mean over ITERATIONS, after WARMUP; bandwidths in GB/s (1e9).
    """
    import time

    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    ranks, results = dist.get_world_size(), []
    for nbytes in sizes:
        tensor = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros: no overflow however often summed
        for _ in range(WARMUP):
            dist.all_reduce(tensor)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(ITERATIONS):
            dist.all_reduce(tensor)
        sync()
        seconds = torch.tensor([(time.perf_counter() - start) / ITERATIONS], dtype=torch.float64, device=device)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        algbw, busbw = bus_bandwidth(nbytes, seconds.item(), ranks)
        results.append(
            {
                "bytes": nbytes,
                "ranks": ranks,
                "seconds": seconds.item(),
                "algbw_gb_s": algbw / 1e9,
                "busbw_gb_s": busbw / 1e9,
            }
        )
    return results


def all_reduce_check() -> dict[str, object]:
    """One all-reduce across every task, then the bus bandwidth; with NCCL, the transport it chose."""
    import torch
    import torch.distributed as dist

    use_nccl = torch.cuda.is_available() and dist.is_nccl_available()
    log_dir = tempfile.mkdtemp(prefix="hpctrain-nccl-")
    if use_nccl:
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=f"{log_dir}/nccl.%h.%p")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group("nccl" if use_nccl else "gloo", timeout=timedelta(seconds=PEERS_TIMEOUT_S))
    device = torch.device("cuda" if use_nccl else "cpu")
    value = torch.ones(1, device=device)
    dist.all_reduce(value)
    bandwidth = all_reduce_bandwidth(NCCL_SIZES if use_nccl else GLOO_SIZES, device)
    dist.destroy_process_group()
    result: dict[str, object] = {
        "backend": "nccl" if use_nccl else "gloo",
        "sum": int(value.item()),
        "bandwidth": bandwidth,
    }
    if use_nccl:
        text = "".join(Path(p).read_text(errors="replace") for p in glob.glob(f"{log_dir}/nccl.*"))
        result["transport"] = nccl_transport(text)
    return result


def main() -> None:
    os.environ.update(task_env(os.environ))
    job = JobEnvironment()
    report: dict[str, object] = {"node": job.node, "rank": job.rank, "missing": missing_interfaces(dict(os.environ))}
    try:
        report.update(all_reduce_check())
    except Exception as exc:  # reported, not raised: the doctor shows it per node
        report["error"] = f"{type(exc).__name__}: {exc}"
    print("PREFLIGHT " + json.dumps(report), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
