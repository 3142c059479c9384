"""What measuring GPU use costs (issue 61): the node sampler's CPU time per node-hour, and the ledger's bytes per
GPU-hour, on this machine (no GPU: the `cpu` source, which reads /proc, where NVML would ask the driver).

    .venv/bin/python benchmarks/gpu_sampling.py [--ranks 8] [--readings 300] [--hours 2] [--jobs 20] [--runs 200]

Sampler: --ranks real "shims" (children of this process, as a step's tasks are of its slurmstepd), each running a
process of its own, read --readings times by the `cpu` source, every reading's summaries and timeline kept and a
record journaled every 12 readings, as a node's sampler does: its thread's CPU seconds per node-hour at the default
reading every 5 s, against the node-hour of one core it runs beside (goal: <= 0.5 % of it; on a GPU node the
figure that matters is the step time's share, tests/unit/project/test_cuda.py). The host's process count is
printed: the `cpu` source reads the step's own processes only, through the kernel's children lists (it listed all
of /proc until 2026-12-05: 0.55 ms a reading of 4 ranks among 77 processes, 9-13 ms among 800-1,300 as in a CI
run; now 0.11-0.13 ms with either).

Ledger: --jobs 8-GPU jobs' records of --hours hours each (a record a minute, each with the 8 GPUs' summaries and their
minutes) ingested into a fresh ledger as `reconcile` does, then settled (hpctrain.jobs.accounting.settle: packed,
the samplers' notes dropped), and --runs more runs of a few seconds alike: the bytes of a run's summaries and of a
node's timeline as the job runs and once settled (vacuumed), the CPU seconds of ingesting them, and what the heavy
user's year of benchmarks/ledger_scale.py --heavy would add (its runs' GPUs and GPU-hours, and its runs in the
window curves are kept for, counted in that ledger, where it has been made).
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

from hpctrain.contract import UTILIZATION
from hpctrain.jobs.accounting import GPU_CURVES_KEPT_S, TIMELINE_POINTS, settle
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
            sampler = NodeSampler(source, lambda rec: journal.write(UTILIZATION, **rec), SAMPLE_S, 5, 1, 10)
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
    sampler = NodeSampler(EightGpus(), lambda rec: journal.write(UTILIZATION, **rec, **context), SAMPLE_S, 5, 1, 10)
    at = time.time() - seconds
    for k in range(int(seconds / SAMPLE_S)):
        sampler.sample(at + k * SAMPLE_S, SAMPLE_S)
        if k % REPORT_EVERY == REPORT_EVERY - 1:
            sampler.report(final=False)
    sampler.report(final=True)


def ledger_bytes(hours: float, jobs: int, runs: int) -> dict[str, float]:
    """Bytes in the ledger of --jobs 8-GPU jobs of --hours each, a row a minute and node as they run and a curve of
    at most TIMELINE_POINTS points each once settled; bytes of a run's 8 GPUs' summaries as it runs and settled,
    over --runs runs of a few seconds in jobs of 10 runs each; the CPU seconds per GPU-hour of ingesting; the
    journals' notes included (a settle drops the samplers')."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        with Ledger(folder / "ledger.db") as ledger:
            empty, ingest_s = _vacuumed(ledger), 0.0
            for k in range(jobs):
                job = _ended_job(ledger, folder / f"long-{k}")
                journal = Journal(folder / f"long-{k}" / "journal")
                _journal_run(journal, _context(job, 0), hours * 3600)
                started = time.process_time()
                ingest_journal(ledger, journal)
                ingest_s += time.process_time() - started
            running = _vacuumed(ledger)
            settle(ledger, "dev", time.time() + 8 * 86400)
            settled = _vacuumed(ledger)
            for first in range(0, runs, 10):
                job_dir = folder / f"short-{first}"
                job = _ended_job(ledger, job_dir)
                for attempt in range(10):  # a few seconds each: their summaries, a minute of timeline
                    _journal_run(Journal(job_dir / "journal"), _context(job, attempt), 2 * SAMPLE_S)
                ingest_journal(ledger, Journal(job_dir / "journal"))
            short_running = _vacuumed(ledger)
            settle(ledger, "dev", time.time() + 8 * 86400)
            short_settled = _vacuumed(ledger)
    gpu_hours = 8 * hours * jobs
    run_settled = (short_settled - settled) / runs
    return {
        "running per GPU-hour": (running - empty) / gpu_hours,
        "curve": (settled - empty) / jobs - run_settled,  # less its summaries
        "run running": (short_running - settled) / runs,
        "run settled": run_settled,
        "ingest per GPU-hour": ingest_s / gpu_hours,
    }


def _ended_job(ledger: Ledger, job_dir: Path) -> int:
    return Table(ledger, "jobs").insert(
        {"name": "sampled", "site": "dev", "state": "COMPLETED", "ended_at": time.time(), "job_dir": str(job_dir)}
    )


def _context(job: int, attempt: int) -> dict:
    return {"job_id": job, "attempt": attempt, "task_index": -1, "step_restart": 0, "host": "n1"}


def _vacuumed(ledger: Ledger) -> int:
    """The ledger's bytes once vacuumed (its pages: in WAL mode the file alone says nothing)."""
    ledger.db.execute("VACUUM")
    pages = ledger.db.execute("PRAGMA page_count").fetchone()[0]
    return int(pages * ledger.db.execute("PRAGMA page_size").fetchone()[0])


def heavy_year() -> tuple[float, float, float] | None:
    """The heavy year's ledger, where it has been made: its runs' GPUs, their GPU-hours, and its runs in the window
    curves are kept for (counted once: scans of its 5 GiB, kept beside it)."""
    counted = HEAVY_YEAR.with_suffix(".gpus.json")
    if counted.exists() and len(found := json.loads(counted.read_text())) == 3:
        return tuple(found)  # type: ignore[return-value]
    if not HEAVY_YEAR.exists():
        return None
    conn = sqlite3.connect(f"file:{HEAVY_YEAR}?mode=ro", uri=True)
    gpus = conn.execute("SELECT total(alloc_gpus) FROM attempts").fetchone()[0]
    hours = conn.execute("SELECT total(gpu_hours) FROM job_usage").fetchone()[0]
    newest = conn.execute("SELECT max(started_at) FROM attempts").fetchone()[0]
    recent = conn.execute(
        "SELECT count(*) FROM attempts WHERE started_at >= ? AND alloc_gpus > 0", [newest - GPU_CURVES_KEPT_S]
    ).fetchone()[0]
    conn.close()
    counted.write_text(json.dumps([gpus, hours, recent]))
    return gpus, hours, recent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--readings", type=int, default=300)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    per_reading, processes = sampler_cost(args.ranks, args.readings)
    per_hour = per_reading * 3600 / SAMPLE_S
    print(f"sampler, cpu source, {args.ranks} ranks, {processes} processes on this host: {1000 * per_reading:.2f} ms "
          f"CPU a reading, {per_hour:.2f} CPU s a node-hour at a reading every {SAMPLE_S:g} s")
    figure("GPU sampler (cpu source): CPU seconds per node-hour", per_hour, "CPU s")
    figure("GPU sampler (cpu source): share of one core", per_hour / 3600, "x", "<= 0.005 (issue 61)",
           per_hour / 3600 <= 0.005)
    sizes = ledger_bytes(args.hours, args.jobs, args.runs)
    print(f"ledger: {args.jobs} 8-GPU jobs of {args.hours:g} h: {sizes['running per GPU-hour']:,.0f} bytes a GPU-hour as they run "
          f"(a row a minute, a note a record), a curve {sizes['curve']:,.0f} bytes once settled (at most "
          f"{TIMELINE_POINTS} points); a run's 8 GPUs {sizes['run running']:,.0f} bytes as it runs, "
          f"{sizes['run settled']:,.0f} settled (vacuumed); ingesting {1000 * sizes['ingest per GPU-hour']:.1f} ms CPU "
          "a GPU-hour")
    figure("GPU use in the ledger: an 8-GPU run's summaries, running", sizes["run running"], "B")
    figure("GPU use in the ledger: an 8-GPU run's summaries, settled", sizes["run settled"], "B")
    figure("GPU use in the ledger: per GPU-hour, running", sizes["running per GPU-hour"], "B")
    figure(f"GPU use in the ledger: a settled {args.hours:g} h 8-GPU node's curve", sizes["curve"], "B")
    if (year := heavy_year()) is not None:
        gpus, hours, recent = year
        summaries = gpus / 8 * sizes["run settled"] / 2**30
        curves = recent * sizes["curve"] / 2**30  # at most: a curve a run (it is one a task and node)
        print(f"the heavy year ({HEAVY_YEAR.name}, {HEAVY_YEAR.stat().st_size / 2**30:.1f} GiB): {gpus:,.0f} GPUs of "
              f"runs, {hours:,.0f} GPU-hours ({60 * hours / gpus:.0f} min a GPU's run), {recent:,.0f} runs in the last "
              f"{GPU_CURVES_KEPT_S / 86400:.0f} days: summaries {summaries:.2f} GiB, curves {curves:.2f} GiB at most, "
              f"{2**30 * (summaries + curves) / hours:.1f} bytes a GPU-hour")
        figure("GPU use in the ledger: a heavy year's summaries", summaries, "GiB")
        figure(f"GPU use in the ledger: a heavy year's curves (last {GPU_CURVES_KEPT_S / 86400:.0f} days)", curves, "GiB")
        figure("GPU use in the ledger: a heavy year, bytes per GPU-hour", 2**30 * (summaries + curves) / hours, "B")


if __name__ == "__main__":
    main()
