"""The ledger on a shared file system against a local disk: `status`, a sweep tick and `reconcile` (hpctrain's side, Slurm answered
from the ledger as in benchmarks/ledger_scale.py --heavy) on the same heavy ledger of 10,000 jobs, kept once as
hpctrain keeps it on a local disk (WAL, synchronous=NORMAL) and once as on NFS, GPFS, CephFS or Lustre with flock
(rollback journal, synchronous=FULL: hpctrain.ledger.storage).

    .venv/bin/python benchmarks/ledger_modes.py [--jobs 10000] [--repeats 5] [--shared-dir DIR]

Without --shared-dir both copies lie on this machine's disk and the shared one's mount is a recorded NFSv4 home
directory (this kernel has no NFS client, and sshfs keeps its locks on each host, so hpctrain refuses it): the
figure is the mode's own cost. --shared-dir puts that copy on a real network file system, whose mount table then
decides; there each write transaction's fsyncs and locks are also round trips to the server. On the safe Gluster
home of scripts/gluster-home (probed first: `hpctrain doctor --ledger`), `status` and the tick should cost at most
3x the local disk's (issue 60):

    scripts/gluster-home up && .venv/bin/python benchmarks/ledger_modes.py --shared-dir /var/tmp/hpctrain-gluster/safe/a
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _figures import figure  # noqa: E402
from ledger_scale import median_seconds  # noqa: E402

from hpctrain.config import load_site  # noqa: E402
from hpctrain.files import parse_mountinfo  # noqa: E402
from hpctrain.ledger import Ledger  # noqa: E402

# /proc/self/mountinfo's line of a home directory on NFSv4 at a site (as in tests/unit/ledger/test_ledger_storage.py)
NFS_HOME = ("58 29 0:50 / /home rw,relatime shared:40 - nfs4 fs1:/export/home rw,vers=4.2,rsize=1048576,"
            "wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.5,local_lock=none,"
            "addr=10.0.0.1")
COMMANDS = ("status", "sweep tick", "reconcile")
RATIO_GOALS = {"status": 3.0, "sweep tick": 3.0}  # on a real network home (issue 60)


def _child(path: Path, now: float, ids: dict[str, int], name: str, recorded_nfs: bool, repeats: int):
    """In a process of its own: the mode the ledger got and the command's median seconds."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers.heavy_ledger import heavy_commands

    if recorded_nfs:
        from hpctrain.ledger import storage

        (mount,) = parse_mountinfo(NFS_HOME)
        storage.mount_of = lambda _path: mount  # type: ignore[assignment]
    run = heavy_commands(load_site("dev"), ids)[name]
    with Ledger(path) as ledger:
        return ledger.storage.describe(), median_seconds(run, ledger, now, repeats)


def main() -> None:
    from helpers.heavy_ledger import make_heavy_history

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shared-dir", type=Path, help="a folder on a network file system (default: a recorded one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-bench-modes-", dir="/var/tmp") as tmp:
        made, local = Path(tmp) / "made.db", Path(tmp) / "local.db"
        now, t0 = time.time(), time.perf_counter()
        active = max(args.jobs // 50, 20)  # active jobs and tasks: a fiftieth of the jobs, 12 tasks each
        ids = make_heavy_history(made, args.jobs, now, active=active, active_tasks=active * 12)
        print(f"generated {args.jobs:,} jobs ({active:,} active) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        shared_dir = args.shared_dir or Path(tmp)
        shared = shared_dir / f"hpctrain-bench-shared-{time.time_ns()}.db"
        results: dict[tuple[str, str], tuple[str, float]] = {}
        try:
            for name in COMMANDS:
                for which, path in (("local", local), ("shared", shared)):
                    shutil.copy(made, path)  # the same ledger for each command and mode
                    with multiprocessing.get_context("spawn").Pool(1) as child:
                        results[which, name] = child.apply(
                            _child, (path, now, ids, name, which == "shared" and not args.shared_dir, args.repeats)
                        )
        finally:
            for leftover in shared_dir.glob(shared.name + "*"):
                leftover.unlink()
    print(f"{args.jobs:,} jobs, median of {args.repeats}, s")
    for name in COMMANDS:
        (local_mode, local_s), (shared_mode, shared_s) = results["local", name], results["shared", name]
        print(f"  {name:12}{local_s:9.3f} ({local_mode}){shared_s:9.3f} ({shared_mode}){shared_s / local_s:7.2f}x")
        figure(f"{name}, {args.jobs:,} jobs, shared-file-system mode", shared_s, "s", "<= 1 s", shared_s <= 1)
        goal = RATIO_GOALS.get(name) if args.shared_dir else None
        figure(f"{name}, {args.jobs:,} jobs, shared-file-system mode / local disk", shared_s / local_s, "x",
               f"<= {goal:g}x on a network home (issue 60)" if goal else "", shared_s / local_s <= goal if goal else None)


if __name__ == "__main__":
    main()
