"""A sweep tick over 10,000 trials (9,950 finished, 50 due or pending), on the live dev cluster.

    scripts/dev-cluster up && .venv/bin/python benchmarks/sweep_tick.py [--trials 10000] [--parallel 50]

Per method (random, bayes): the finished trials are written straight into a fresh ledger (as if
earlier ticks had run them); tick 1 suggests and submits the missing trials (held, so nothing runs),
tick 2 finds nothing to do. Slurm's own time (scontrol ping, sacct, sbatch) is measured apart.
Goal: under 2 s of hpctrain time per tick and one sacct call.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from hpctrain.config import load_site
from hpctrain.ledger import Ledger
from hpctrain.sweep import store
from hpctrain.sweep.spec import SweepSpec
from hpctrain.sweep.tick import tick_all

from _figures import figure
from _timing import TimedClient

TASKS_PER_JOB = 1000


def sweep_spec(method: str, trials: int, parallel: int) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": f"bench-{method}", "method": method, "metric": "loss", "direction": "minimize",
        "max_trials": trials, "max_parallel": parallel,
        "search": {"x": {"type": "uniform", "low": -2.0, "high": 2.0}, "lr": {"type": "loguniform", "low": 1e-5, "high": 1e-1}},
        "job": {"name": "bench-trial", "command": ["true"], "launcher": "none", "resources": {"mem": "100M", "time": "5"}},
    })


def seed_finished(ledger: Ledger, sweep: store.Sweep, count: int) -> None:
    """``count`` completed trials in synthetic finished array jobs, each with 10 metric steps."""
    rng = random.Random(0)
    now = time.time()
    with ledger.transaction():
        for first in range(0, count, TASKS_PER_JOB):
            n = min(TASKS_PER_JOB, count - first)
            job_id = ledger.db.table("jobs").insert({
                "name": "bench-trial", "site": "dev", "slurm_job_id": str(9_000_000 + first), "is_array": 1,
                "state": "COMPLETED", "sweep_id": sweep.id, "submitted_at": now - 3600}).last_rowid
            ledger.db.table("array_tasks").insert_all(
                {"job_id": job_id, "task_index": t, "param_index": t, "state": "COMPLETED"} for t in range(n))
            params = [{"x": rng.uniform(-2, 2), "lr": 10 ** rng.uniform(-5, -1)} for _ in range(n)]
            ledger.db.table("trials").insert_all(
                {"sweep_id": sweep.id, "number": first + t, "params_json": json.dumps(p), "state": "completed",
                 "job_id": job_id, "task_index": t, "failures": 0} for t, p in enumerate(params))
            ledger.db.table("metrics").insert_all(
                {"job_id": job_id, "task_index": t, "name": "loss", "step": s, "value": p["x"] ** 2 + 1 / s, "time": now}
                for t, p in enumerate(params) for s in range(1, 11))


def timed_tick(ledger: Ledger, client: TimedClient, site) -> tuple[float, float, dict, list]:
    client.reset()
    t0 = time.perf_counter()
    results = tick_all(ledger, client, site)
    return time.perf_counter() - t0, client.slurm_seconds, dict(client.calls), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--parallel", type=int, default=50)
    args = parser.parse_args()
    site = load_site("dev")
    print(f"sweep tick over {args.trials} trials ({args.trials - args.parallel} finished), {args.parallel} at once")
    for method in ("random", "bayes"):
        workdir = Path(tempfile.mkdtemp(prefix="hpctrain-bench-tick-"))
        client = TimedClient.for_site(site)
        client.held = True
        with Ledger(workdir / "ledger.db") as ledger:
            sweep, _ = store.register(ledger, sweep_spec(method, args.trials, args.parallel), workdir / "sweep.toml")
            seed_finished(ledger, sweep, args.trials - args.parallel)
            try:
                for label in ("tick 1 (suggest + submit)", "tick 2 (nothing due)"):
                    total, slurm, calls, results = timed_tick(ledger, client, site)
                    print(f"  {method:6} {label:26} total {total:.2f} s = Slurm {slurm:.2f} s + hpctrain "
                          f"{total - slurm:.2f} s (goal < 2 s); submitted {len(results[0].submitted)}; "
                          f"calls {calls}")
                    figure(f"{method} {label}, {args.trials} trials, hpctrain time", total - slurm, "s", "< 2 s",
                           total - slurm < 2 and calls.get("sacct", 0) <= 1)
            finally:
                real = ledger.db.table("jobs").rows_where("CAST(slurm_job_id AS INTEGER) < 9000000")
                client.scancel([r["slurm_job_id"] for r in real])


if __name__ == "__main__":
    main()
