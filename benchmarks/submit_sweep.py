"""Submit a 10,000-task sweep and read status over 10,000 ledger rows, on the live dev cluster.

    scripts/dev-cluster up && .venv/bin/python benchmarks/submit_sweep.py [--tasks 10000]

Jobs are submitted held (`sbatch --hold`) and cancelled afterwards, so nothing runs. Slurm's own
time (inside sbatch/sacct) is measured separately from hpctrain's.
Goals: at most 10 sbatch calls and under 5 s of hpctrain time for the submission; status under
1 s of hpctrain time over 10,000 ledger rows.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.jobs.poll import Poller, job_summaries
from hpctrain.ledger import Ledger
from hpctrain.submit import Submitter

from _figures import figure
from _timing import TimedClient


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=10_000)
    args = parser.parse_args()
    site = load_site("dev")
    workdir = Path(tempfile.mkdtemp(prefix="hpctrain-bench-"))
    ledger = Ledger(workdir / "ledger.db")
    client = TimedClient.for_site(site)
    client.held = True
    spec = JobSpec.model_validate({
        "name": "bench-sweep", "command": ["true"], "launcher": "none",
        "resources": {"mem": "100M", "time": "5"},
        "array": {"params": [{"lr": 10 ** (-i % 7), "seed": i} for i in range(args.tasks)], "throttle": 50},
    })
    t0 = time.perf_counter()
    sub = Submitter(site, ledger, client).submit(spec, "<bench>")
    total = time.perf_counter() - t0
    try:
        submit_slurm = client.slurm_seconds
        print(f"submit {args.tasks} tasks: {client.calls['sbatch']} sbatch calls, {len(sub.slurm_ids)} arrays")
        print(f"  total {total:.2f} s = Slurm {submit_slurm:.2f} s + hpctrain {total - submit_slurm:.2f} s "
              f"(goal: <= 10 sbatch calls, hpctrain < 5 s)")
        figure(f"submit {args.tasks} tasks, hpctrain time", total - submit_slurm, "s", "< 5 s", total - submit_slurm < 5)
        figure(f"submit {args.tasks} tasks, sbatch calls", client.calls["sbatch"], "calls", "<= 10",
               client.calls["sbatch"] <= 10)

        # Status over 10,000 ledger rows: the arrays plus synthetic finished jobs.
        ledger.db.table("jobs").insert_all(
            {"name": f"old{i}", "site": "dev", "slurm_job_id": str(5_000_000 + i), "state": "COMPLETED",
             "submitted_at": time.time() - 86400} for i in range(10_000 - len(sub.ledger_ids))
        )
        client.reset()
        t0 = time.perf_counter()
        Poller(ledger, client, "dev").refresh()
        rows = job_summaries(ledger, "dev", limit=10_000)
        poll_total = time.perf_counter() - t0
        t0 = time.perf_counter()
        raw = ledger.db.execute("SELECT * FROM jobs").fetchall()
        raw_s = time.perf_counter() - t0
        print(f"status over {len(rows)} ledger rows ({len(raw)} jobs, {args.tasks} array tasks): "
              f"{client.calls['sacct']} sacct call(s)")
        ours = poll_total - client.slurm_seconds
        figure("status over 10,000 ledger rows, hpctrain time", ours, "s", "< 1 s", ours < 1)
        print(f"  total {poll_total:.3f} s = Slurm {client.slurm_seconds:.3f} s + hpctrain "
              f"{poll_total - client.slurm_seconds:.3f} s (goal < 1 s); raw SELECT of all jobs {raw_s:.3f} s "
              f"-> {(poll_total - client.slurm_seconds) / raw_s:.1f}x")
        env = {**os.environ, "HPCTRAIN_LEDGER": str(workdir / "ledger.db")}
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "hpctrain", "status", "--all", "--no-refresh", "--json",
                        "--limit", "10000"], check=True, env=env, stdout=subprocess.DEVNULL)
        print(f"  `hpctrain status --all --no-refresh --json` CLI over 10,000 rows: {time.perf_counter() - t0:.3f} s")
    finally:
        client.scancel(sub.slurm_ids)


if __name__ == "__main__":
    main()
