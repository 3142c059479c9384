"""What measuring GPU use costs (issue 61): the node sampler's CPU time per node-hour, and the ledger's bytes per
GPU-hour, on this machine (no GPU: the `cpu` source, which reads /proc, where NVML would ask the driver).

    .venv/bin/python benchmarks/gpu_sampling.py [--ranks 8] [--readings 300] [--hours 10] [--runs 200]

Sampler: --ranks real "shims" (children of this process, as a step's tasks are of its slurmstepd), each running a
process of its own, read --readings times by the `cpu` source, every reading's summaries and timeline kept and a
record journaled every 12 readings, as a node's sampler does: its thread's CPU seconds per node-hour at the default
reading every 5 s, against the node-hour of one core it runs beside (goal: <= 0.5 % of it; on a GPU node the
figure that matters is the step time's share, tests/unit/project/test_cuda.py). The host's process count is
printed: the `cpu` source lists /proc each reading.

Ledger: one 8-GPU job's records of --hours hours (a record a minute, each with the 8 GPUs' summaries and their
minutes) ingested into a fresh ledger as `reconcile` does, and --runs more runs of a few minutes: the bytes of a
GPU's summary per run and of its timeline per GPU-hour once vacuumed, the CPU seconds of ingesting them, and what
the heavy user's year of benchmarks/ledger_scale.py --heavy would add (its runs' GPUs and GPU-hours counted in that
ledger, where it has been made).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.jobs.accounting import TIMELINE_ROWS
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table
from hpctrain.runtime.utilization import REPORT_EVERY, NodeSampler, ProcessSource, Reading

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _figures import figure  # noqa: E402

SAMPLE_S = 5.0  # the default [idle] sample_s
HEAVY_YEAR = Path("/var/tmp/hpctrain-bench-ledger/heavy-1000000-365d.db")


def sampler_cost(ranks: int, readings: int) -> tuple[float, int]:
    """CPU seconds per reading of the `cpu` source with its summaries and records, over ``ranks`` real ranks."""
    shims = [
        subprocess.Popen(["sh", "-c", '"$0" -c "import time; time.sleep(600)"; true', sys.executable],
                         env={**os.environ, "SLURM_LOCALID": str(rank)}, start_new_session=True)
        for rank in range(ranks)
    ]
    try:
        source = ProcessSource([str(d) for d in range(ranks)], step_pid=os.getpid())
        while len(source.shims) < ranks:
            source.read()
            time.sleep(0.2)
        with tempfile.TemporaryDirectory() as tmp:
            journal = Journal(Path(tmp))
            sampler = NodeSampler(source, lambda rec: journal.write("utilization", **rec), SAMPLE_S, 5, 1, 10)
            at = time.time()
            started = time.thread_time()
            for k in range(readings):
                sampler.sample(at + k * SAMPLE_S, SAMPLE_S)
                if k % REPORT_EVERY == REPORT_EVERY - 1:
                    sampler.report(final=False)
            spent = time.thread_time() - started
    finally:
        for shim in shims:  # and its rank's process: a group of its own
            os.killpg(shim.pid, signal.SIGKILL)
            shim.wait()
    return spent / readings, len([p for p in os.listdir("/proc") if p.isdigit()])


class EightGpus:
    kind, devices = "nvml", [str(d) for d in range(8)]

    def read(self) -> list[Reading]:
        return [Reading(50.0 + d, 3e10, 8e10, 300.0) for d in range(8)]

    def close(self) -> None:
        pass


def _journal_run(journal: Journal, context: dict, seconds: float) -> None:
    """A node sampler's records of one run of an 8-GPU job, ``seconds`` long, ending now."""
    sampler = NodeSampler(EightGpus(), lambda rec: journal.write("utilization", **rec, **context), SAMPLE_S, 5, 1, 10)
    at = time.time() - seconds
    for k in range(int(seconds / SAMPLE_S)):
        sampler.sample(at + k * SAMPLE_S, SAMPLE_S)
        if k % REPORT_EVERY == REPORT_EVERY - 1:
            sampler.report(final=False)
    sampler.report(final=True)


def ledger_bytes(hours: float, runs: int) -> tuple[float, float, float, float]:
    """Bytes of a GPU's summary per run, of its timeline per GPU-hour as it runs and once settled (thinned to
    TIMELINE_ROWS), and the CPU seconds per GPU-hour of ingesting --hours of one 8-GPU job."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with Ledger(folder / "ledger.db") as ledger:
            job = Table(ledger, "jobs").insert({"name": "sampled", "site": "dev", "state": "RUNNING"})
            sizes = [_vacuumed(ledger)]
            long = Journal(folder / "long")
            _journal_run(long, {"job_id": job, "attempt": 0, "task_index": -1, "step_restart": 0, "host": "n1"},
                         hours * 3600)
            started = time.process_time()
            ingest_journal(ledger, long)
            ingest_s = time.process_time() - started
            sizes.append(_vacuumed(ledger))
            ledger.gpus.thin([job], TIMELINE_ROWS)  # as settling the ended job does
            settled = _vacuumed(ledger)
            short = Journal(folder / "short")
            for attempt in range(1, runs + 1):  # a few seconds each: their summaries, a minute of timeline
                _journal_run(short, {"job_id": job, "attempt": attempt, "task_index": -1, "step_restart": 0,
                                     "host": "n1"}, 2 * SAMPLE_S)
            ingest_journal(ledger, short)
            sizes.append(_vacuumed(ledger))
    per_summary = (sizes[2] - settled) / (8 * runs)  # a minute of timeline each too: counted as summary
    per_hour = (sizes[1] - sizes[0] - 8 * per_summary) / (8 * hours)
    per_hour_settled = (settled - sizes[0] - 8 * per_summary) / (8 * hours)
    return per_summary, per_hour, per_hour_settled, ingest_s / (8 * hours)


def _vacuumed(ledger: Ledger) -> int:
    """The ledger's bytes once vacuumed (its pages: in WAL mode the file alone says nothing)."""
    ledger.db.execute("VACUUM")
    pages = ledger.db.execute("PRAGMA page_count").fetchone()[0]
    return int(pages * ledger.db.execute("PRAGMA page_size").fetchone()[0])


def heavy_year() -> tuple[float, float] | None:
    """The GPUs of every run and the GPU-hours of the heavy year's ledger, where it has been made (counted once:
    two scans of its 5 GiB, kept beside it)."""
    counted = HEAVY_YEAR.with_suffix(".gpus.json")
    if counted.exists():
        return tuple(json.loads(counted.read_text()))  # type: ignore[return-value]
    if not HEAVY_YEAR.exists():
        return None
    conn = sqlite3.connect(f"file:{HEAVY_YEAR}?mode=ro", uri=True)
    gpus = conn.execute("SELECT total(alloc_gpus) FROM attempts").fetchone()[0]
    hours = conn.execute("SELECT total(gpu_hours) FROM job_usage").fetchone()[0]
    conn.close()
    counted.write_text(json.dumps([gpus, hours]))
    return gpus, hours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--readings", type=int, default=300)
    parser.add_argument("--hours", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    per_reading, processes = sampler_cost(args.ranks, args.readings)
    per_hour = per_reading * 3600 / SAMPLE_S
    print(f"sampler, cpu source, {args.ranks} ranks, {processes} processes on this host: {1000 * per_reading:.2f} ms "
          f"CPU a reading, {per_hour:.2f} CPU s a node-hour at a reading every {SAMPLE_S:g} s")
    figure("GPU sampler (cpu source): CPU seconds per node-hour", per_hour, "CPU s")
    figure("GPU sampler (cpu source): share of one core", per_hour / 3600, "x", "<= 0.005 (issue 61)",
           per_hour / 3600 <= 0.005)
    per_summary, per_hour, settled, ingest = ledger_bytes(args.hours, args.runs)
    print(f"ledger: a GPU's summary {per_summary:,.0f} bytes a run, its timeline {per_hour:,.0f} bytes a GPU-hour as "
          f"it runs, {settled:,.0f} once a {args.hours:g} h run settled (at most {TIMELINE_ROWS} rows a node; "
          f"vacuumed); ingesting {1000 * ingest:.1f} ms CPU a GPU-hour")
    figure("GPU use in the ledger: a GPU's summary per run", per_summary, "B")
    figure("GPU use in the ledger: timeline per GPU-hour, running", per_hour, "B")
    figure(f"GPU use in the ledger: timeline per GPU-hour, a settled {args.hours:g} h run", settled, "B")
    if (year := heavy_year()) is not None:
        gpus, hours = year
        # Settled, a GPU's run keeps at most TIMELINE_ROWS minutes' worth: its mean length, capped.
        capped_hours = gpus * min(hours / gpus, TIMELINE_ROWS / 60)
        summaries, timeline = gpus * per_summary / 2**30, capped_hours * per_hour / 2**30
        print(f"the heavy year ({HEAVY_YEAR.name}, {HEAVY_YEAR.stat().st_size / 2**30:.1f} GiB): {gpus:,.0f} GPUs of "
              f"runs, {hours:,.0f} GPU-hours ({60 * hours / gpus:.0f} min a GPU's run): summaries {summaries:.2f} GiB, "
              f"settled timelines {timeline:.2f} GiB")
        figure("GPU use in the ledger: a heavy year's summaries", summaries, "GiB")
        figure("GPU use in the ledger: a heavy year's settled timelines", timeline, "GiB")


if __name__ == "__main__":
    main()
