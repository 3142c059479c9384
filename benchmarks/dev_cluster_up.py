"""Bring-up time of scripts/dev-cluster in a scratch root: cold (new root), warm (after down), no-op.

    .venv/bin/python benchmarks/dev_cluster_up.py   # as root; uses port base 19800, removes its root after
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

from _figures import figure


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "dev-cluster"


def timed(action: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([SCRIPT, action], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="hpctrain-bench-", dir="/var/tmp"))
    root.chmod(0o755)
    env = {**os.environ, "HPCTRAIN_DEV_ROOT": str(root), "HPCTRAIN_DEV_PORT_BASE": "19800"}
    try:
        cold = timed("up", env)
        noop = timed("up", env)
        down = timed("down", env)
        warm = timed("up", env)
    finally:
        subprocess.run([SCRIPT, "reset"], env=env, stdout=subprocess.DEVNULL)
    print(f"{'step':28} {'seconds':>8}")
    for name, secs in [("up, cold (new root)", cold), ("up again (no-op)", noop), ("down", down), ("up, warm (after down)", warm)]:
        print(f"{name:28} {secs:8.2f}")
    print(f"goal: working cluster in under 30 s -> cold {cold / 30:.2f} of the budget")
    figure("dev cluster up, cold", cold, "s", "< 30 s", cold < 30)
    figure("dev cluster up, warm (after down)", warm, "s")


if __name__ == "__main__":
    main()
