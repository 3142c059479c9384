"""`hpctrain export mlflow` of 1,000 jobs with 10,000 metric points each, against MLflow's own batch logging
(`MlflowClient.log_batch`, 1,000 points a call) of the same points into the same kind of store, and a second export
that finds nothing new.

    .venv/bin/python benchmarks/mlflow_export.py [--jobs 1000] [--points 10000]

Both write to a fresh MLflow SQLite store (MLflow's default store) on local disk: the baseline makes one run per
job and logs its points; the export also reads them from the ledger and sends each run's params and tags. Goal:
the export within 1.25x of the baseline, and the second export under 1% of the first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.trackers.mlflow_export import BATCH, export_mlflow
from hpctrain.trackers.mlflow_uri import parse

from _figures import figure

T0 = time.time() - 86400


def make_ledger(path: Path, jobs: int, points: int) -> list[int]:
    ids = []
    with Ledger(path) as ledger:
        for i in range(jobs):
            lineage = {"hyperparameters": {"lr": 1e-4 * (i + 1)}, "seed": i, "code": {"commit": "abc", "dirty": False}}
            job = Table(ledger, "jobs").insert({"name": f"run-{i}", "site": "dev", "state": "COMPLETED",
                                                "submitted_at": T0, "ended_at": T0 + points,
                                                "lineage_json": json.dumps(lineage)})
            ledger.db.conn.executemany(
                "INSERT INTO metrics (job_id, task_index, name, step, value, attempt, time) VALUES (?, -1, 'loss', ?, ?, 0, ?)",
                [(job, s, 5 - s / points, T0 + s) for s in range(1, points + 1)],
            )
            ledger.db.conn.commit()
            ids.append(job)
    return ids


def baseline(uri: str, jobs: int, points: int) -> float:
    """MLflow's own: a run per job, its points by log_batch, 1,000 a call."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric

    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("baseline")
    batches = [[Metric("loss", 5 - s / points, int((T0 + s) * 1000), s) for s in range(b, min(b + BATCH, points + 1))]
               for b in range(1, points + 1, BATCH)]  # built before the clock starts: the ledger's reads are timed
    start = time.perf_counter()
    for i in range(jobs):
        run = client.create_run(experiment, int(T0 * 1000), run_name=f"run-{i}").info.run_id
        for batch in batches:
            client.log_batch(run, metrics=batch)
        client.set_terminated(run, "FINISHED", int((T0 + points) * 1000))
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--points", type=int, default=10_000)
    args = parser.parse_args()
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    with tempfile.TemporaryDirectory(prefix="hpctrain-mlflow-bench-", dir="/var/tmp") as tmp:
        ledger_path = Path(tmp) / "ledger.db"
        made = time.perf_counter()
        ids = make_ledger(ledger_path, args.jobs, args.points)
        total = args.jobs * args.points
        print(f"ledger of {args.jobs} jobs x {args.points} points in {time.perf_counter() - made:.1f} s")
        base = baseline(f"sqlite:///{tmp}/baseline.db", args.jobs, args.points)
        print(f"baseline (log_batch): {base:.1f} s, {total / base:,.0f} points/s")
        uri = f"sqlite:///{tmp}/export.db"
        with Ledger(ledger_path) as ledger:
            jobs = [ledger.jobs.known(i) for i in ids]
            start = time.perf_counter()
            sent = export_mlflow(ledger, jobs, parse(uri), "export")
            first = time.perf_counter() - start
            start = time.perf_counter()
            again = export_mlflow(ledger, jobs, parse(uri), "export")
            second = time.perf_counter() - start
        assert sent.metrics == total and again.metrics == 0 and again.runs_created == 0
        print(f"hpctrain export mlflow: {first:.1f} s, {total / first:,.0f} points/s; again: {second:.2f} s")
    ratio = first / base
    figure(f"export of {args.jobs} jobs x {args.points} points to MLflow (SQLite)", round(first, 1), "s")
    figure("export / MLflow log_batch of the same points", round(ratio, 3), "x", goal="<= 1.25", met=ratio <= 1.25)
    figure("second export (nothing new) / first", round(second / first, 4), "x", goal="< 0.01",
           met=second / first < 0.01)
    return 0 if ratio <= 1.25 else 1


if __name__ == "__main__":
    sys.exit(main())
