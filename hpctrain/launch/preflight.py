"""Network preflight, run as one task per node by `hpctrain doctor --nccl`.

Each task checks that the interfaces and HCAs the site config names exist on its node, then all
tasks run one tiny all-reduce: over NCCL where CUDA is present (reading NCCL's own log to see
whether it used InfiniBand or fell back to sockets), else over gloo. It reports what it saw;
it does not guess.

    srun -N2 --ntasks-per-node=1 python -m hpctrain.launch.preflight
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from hpctrain.contract import JobEnvironment
from hpctrain.launch.rendezvous import task_env


def missing_interfaces(env: dict[str, str], net_dir: str = "/sys/class/net", ib_dir: str = "/sys/class/infiniband") -> list[str]:
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


def all_reduce_check() -> dict[str, object]:
    """One all-reduce across every task; with NCCL, the transport it chose."""
    import torch
    import torch.distributed as dist

    use_nccl = torch.cuda.is_available() and dist.is_nccl_available()
    log_dir = tempfile.mkdtemp(prefix="hpctrain-nccl-")
    if use_nccl:
        os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=f"{log_dir}/nccl.%h.%p")
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group("nccl" if use_nccl else "gloo")
    value = torch.ones(1, device="cuda" if use_nccl else "cpu")
    dist.all_reduce(value)
    dist.destroy_process_group()
    result: dict[str, object] = {"backend": "nccl" if use_nccl else "gloo", "sum": int(value.item())}
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
