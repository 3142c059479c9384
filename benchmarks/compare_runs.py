"""`hpctrain compare` of 100 runs with 10,000 metric points each: the ledger side (settings, final and best values,
GPU-hours, attempts), against reading every point of those runs as the page's curves do, in the same ledger.

    .venv/bin/python benchmarks/compare_runs.py [--runs 100] [--points 10000]

Each run is a job with its lineage, two attempts on 4 GPUs and `loss` at every step (plus `eval/loss` every 25
steps) in a ledger of its own. Goal: the ledger side under 1 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.report.compare import DEFAULT_METRICS, compare_runs, parse_metrics, runs_of_jobs

from _figures import figure

T0 = time.time() - 86400
EVAL_EVERY = 25


def make_ledger(path: Path, runs: int, points: int) -> None:
    with Ledger(path) as ledger:
        for i in range(runs):
            lineage = {"hyperparameters": {"lr": 1e-4 * (i + 1)}, "seed": i, "code": {"commit": "abc", "dirty": False}}
            job = Table(ledger, "jobs").insert({"name": f"run-{i}", "site": "dev", "state": "COMPLETED",
                                                "submitted_at": T0, "lineage_json": json.dumps(lineage)})
            for attempt in range(2):
                ledger.attempts.record(job, -1, attempt, state="COMPLETED", cause="completed",
                                       started_at=T0 + attempt * 3600, ended_at=T0 + (attempt + 1) * 3600,
                                       alloc_gpus=4, elapsed_s=3600)
            steps = points * EVAL_EVERY // (EVAL_EVERY + 1)
            ledger.db.conn.executemany(
                "INSERT INTO metrics (job_id, task_index, name, step, value, attempt, time) VALUES (?, -1, ?, ?, ?, 0, ?)",
                [(job, "loss", s, 5 - s / steps, T0 + s) for s in range(1, steps + 1)]
                + [(job, "eval/loss", s, 5.1 - s / steps, T0 + s) for s in range(EVAL_EVERY, steps + 1, EVAL_EVERY)],
            )
            ledger.db.conn.commit()
        ledger.db.execute("ANALYZE")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--points", type=int, default=10_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpctrain-compare-") as tmp:
        path = Path(tmp) / "ledger.db"
        made = time.perf_counter()
        make_ledger(path, args.runs, args.points)
        print(f"ledger of {args.runs} runs x {args.points} points in {time.perf_counter() - made:.1f} s")
        with Ledger(path) as ledger:
            ids = list(range(1, args.runs + 1))
            start = time.perf_counter()
            comparison = compare_runs(ledger, runs_of_jobs(ledger, ids), parse_metrics(DEFAULT_METRICS))
            compare_s = time.perf_counter() - start
            start = time.perf_counter()
            read = sum(len(ledger.metrics.of_job(i, -1, DEFAULT_METRICS)) for i in ids)
            read_s = time.perf_counter() - start
    assert comparison.differing == ["hyperparameters.lr", "seed"], comparison.differing
    print(f"compare (ledger side): {compare_s:.3f} s; reading every point ({read} rows): {read_s:.3f} s")
    figure(f"compare {args.runs} runs x {args.points} points, ledger side", compare_s, "s", goal="< 1 s", met=compare_s < 1)
    figure("reading every point of them (the page's curves)", read_s, "s", goal="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
