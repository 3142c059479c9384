"""A year of ledger: the hpctrain side of `status`, `status --all`, `show`, `cost --since`, `report --account` and a
sweep tick, on a user's year of 1,000,000 jobs (10,000 sweeps, 10 million metric rows) against the same user's last
40 days alone (the same recent jobs, 11 % of the history), in one run.

    .venv/bin/python benchmarks/ledger_scale.py [--jobs 1000000] [--sweeps 10000] [--metrics 10000000] [--repeats 5]

Both ledgers are generated straight into SQLite (tests/helpers/ledger.py: a job every 32 s, the newest 50 still
running; each ended one with its run, events and checkpoints; sweeps as arrays of 20 trials)
and kept under /var/tmp/hpctrain-bench-ledger for later runs. Slurm answers nothing (what Slurm costs is
benchmarks/submit_sweep.py's): each figure is the ledger's and hpctrain's own time, the median of the repeats
after one warm-up (imports, page cache). Goal (issue 20): each under 1 s and not growing with the history.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from hpctrain.config import load_site
from hpctrain.jobs.accounting import settle
from hpctrain.ledger import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _figures import figure  # noqa: E402
from helpers.ledger import SITE, commands, make_history  # noqa: E402

CACHE = Path("/var/tmp/hpctrain-bench-ledger")
RECENT_DAYS = 40  # longer than any window the commands ask for (cost: 7 days, report: 30)


def ledger_of(jobs: int, sweeps: int, metric_rows: int, days: float) -> tuple[Path, float]:
    """The generated ledger of this size (made once) and the time it was made as of."""
    path = CACHE / f"ledger-{jobs}-{sweeps}-{metric_rows}-{days:g}d.db"
    stamp = path.with_suffix(".now")
    if not stamp.exists():
        for stale in CACHE.glob(path.name + "*"):
            stale.unlink()
        CACHE.mkdir(parents=True, exist_ok=True)
        now, t0 = time.time(), time.perf_counter()
        make_history(path, jobs, sweeps, metric_rows, now, days)
        print(f"generated {path} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        stamp.write_text(str(now))
    return path, float(stamp.read_text())


def timings(path: Path, now: float, repeats: int) -> dict[str, float]:
    """Each command's median seconds on the ledger at ``path``, once its settled jobs' runs are kept (done as the
    jobs settle, a few each minute, by reconcile; a ledger from before schema v11 does all of them once)."""
    out = {}
    with Ledger(path) as ledger:
        t0 = time.perf_counter()
        if jobs := settle(ledger, SITE, now):
            print(f"{path.name}: kept the runs of {jobs:,} settled jobs in {time.perf_counter() - t0:.1f} s",
                  file=sys.stderr)
        for name, run in commands(load_site("dev")).items():
            run(ledger, now)  # warm-up
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                run(ledger, now)
                times.append(time.perf_counter() - t0)
            out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--sweeps", type=int, default=10_000)
    parser.add_argument("--metrics", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    part = RECENT_DAYS / 365
    small_path, small_now = ledger_of(*(round(n * part) for n in (args.jobs, args.sweeps, args.metrics)), RECENT_DAYS)
    large_path, large_now = ledger_of(args.jobs, args.sweeps, args.metrics, 365)
    recent = round(args.jobs * part)
    small, large = timings(small_path, small_now, args.repeats), timings(large_path, large_now, args.repeats)
    size_mb = large_path.stat().st_size / 2**20
    print(f"hpctrain side, median of {args.repeats} (Slurm answering nothing), s")
    print(f"  {'command':28}{recent:>12,} jobs{args.jobs:>14,} jobs{'ratio':>8}")
    for name in large:
        print(f"  {name:28}{small[name]:17.3f}{large[name]:19.3f}{large[name] / small[name]:8.2f}")
    print(f"  ledger file: {size_mb:,.0f} MiB at {args.jobs:,} jobs, {args.metrics:,} metric rows")
    for name, seconds in large.items():
        figure(f"{name}, {args.jobs:,}-job ledger", seconds, "s", "< 1 s (issue 20)", seconds < 1)
        ratio = seconds / small[name]
        figure(f"{name}, a year / its last {RECENT_DAYS} days", ratio, "x", "<= 1.5 (issue 20)", ratio <= 1.5)
    figure(f"ledger file at {args.jobs:,} jobs", size_mb, "MiB")


if __name__ == "__main__":
    main()
