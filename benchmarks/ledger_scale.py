"""A year of ledger: the hpctrain side of `status`, `status --all`, `show`, `cost --since`, `report --account` and a
sweep tick, on a user's year of 1,000,000 jobs (10,000 sweeps, 10 million metric rows) against the same user's last
40 days alone (the same recent jobs, 11 % of the history), in one run.

    .venv/bin/python benchmarks/ledger_scale.py [--jobs 1000000] [--sweeps 10000] [--metrics 10000000] [--repeats 5]

Both ledgers are generated straight into SQLite (tests/helpers/ledger.py: a job every 32 s, the newest 50 still
running; each ended one with its run, events and checkpoints; sweeps as arrays of 20 trials)
and kept under /var/tmp/hpctrain-bench-ledger for later runs. Slurm answers nothing (what Slurm costs is
benchmarks/submit_sweep.py's): each figure is the ledger's and hpctrain's own time, the median of the repeats
after one warm-up (imports, page cache). Goal (issue 20): each under 1 s and not growing with the history.

    .venv/bin/python benchmarks/ledger_scale.py --heavy [--jobs 1000000] [--repeats 5]

A heavy user's year instead (issue 41; tests/helpers/heavy_ledger.py): many runs per job, 2,000 active jobs with
24,000 active array tasks, heavy-tailed metrics, runs cancelled before they started, every run's GPU use as its
node samplers leave it (issue 61: packed once settled, curves for 40 days); Slurm answers for the active jobs
(nothing new). Each command runs in a process of its own, on the ledger as generated (no planner statistics,
as users' ledgers were) and again once analysed: its median, and the process's peak RSS. Goals: each <= 1 s (cost
and report over 30 days <= 2 s), RSS <= 200 MB, a year / its last 40 days <= 1.3.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

from hpctrain.config import load_site
from hpctrain.jobs.accounting import settle
from hpctrain.ledger import Ledger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _figures import figure  # noqa: E402
from helpers.heavy_ledger import add_gpu_use, make_heavy_history  # noqa: E402
from helpers.ledger import SITE, commands, make_history  # noqa: E402

CACHE = Path("/var/tmp/hpctrain-bench-ledger")
RECENT_DAYS = 40  # longer than any window the commands ask for (cost: 7 days, report: 30)


def cached(name: str, make: Callable[[Path, float], dict[str, Any] | None]) -> tuple[Path, dict[str, Any]]:
    """The ledger CACHE/``name``, made once by ``make(path, now)``; what it returned is kept beside it, with the
    time it was made as of ("now")."""
    path = CACHE / name
    stamp = path.with_suffix(".json")
    if not stamp.exists():
        for stale in CACHE.glob(path.name + "*"):
            stale.unlink()
        CACHE.mkdir(parents=True, exist_ok=True)
        now, t0 = time.time(), time.perf_counter()
        made = make(path, now) or {}
        print(f"generated {path} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        stamp.write_text(json.dumps({"now": now, **made}))
    return path, json.loads(stamp.read_text())


def ledger_of(jobs: int, sweeps: int, metric_rows: int, days: float) -> tuple[Path, float]:
    """The generated ledger of this size and the time it was made as of."""
    path, made = cached(f"ledger-{jobs}-{sweeps}-{metric_rows}-{days:g}d.db",
                        lambda p, now: make_history(p, jobs, sweeps, metric_rows, now, days))
    return path, made["now"]


def median_seconds(run: Callable[[Ledger, float], object], ledger: Ledger, now: float, repeats: int) -> float:
    """The median of ``repeats`` runs after one warm-up (imports, page cache, what a first run writes)."""
    run(ledger, now)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(ledger, now)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


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
            out[name] = median_seconds(run, ledger, now, repeats)
    return out


def heavy_ledger_of(jobs: int, days: float) -> tuple[Path, float, dict[str, int]]:
    """The heavy ledger of this size, the time it was made as of, and the ids to time."""
    path, made = cached(f"heavy-{jobs}-{days:g}d.db", lambda p, now: {"ids": make_heavy_history(p, jobs, now, days)})
    if "gpu_runs" not in made:  # made before issue 61: its runs' GPU use added
        t0 = time.perf_counter()
        made["gpu_runs"] = add_gpu_use(path, made["now"])
        print(f"added the GPU use of {made['gpu_runs']:,} runs to {path} in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr)
        path.with_suffix(".json").write_text(json.dumps(made))
    return path, made["now"], made["ids"]


def set_statistics(ledger: Ledger, analysed: bool) -> None:
    """Fresh planner statistics, or none (as users' ledgers were): an empty sqlite_stat1, which opening the ledger
    leaves as it is (it analyses only where the table is missing)."""
    if analysed:
        ledger.analyze()
        return
    conn = ledger.db.conn
    conn.execute("DELETE FROM sqlite_stat1")
    conn.commit()
    conn.execute("ANALYZE sqlite_schema")  # the planner forgets what opening the ledger made


def _heavy_child(path: Path, now: float, ids: dict[str, int], name: str, analysed: bool, repeats: int):
    """In a process of its own: the command's median seconds and the process's peak RSS (MiB)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from helpers.heavy_ledger import heavy_commands

    run = heavy_commands(load_site("dev"), ids)[name]
    with Ledger(path) as ledger:
        set_statistics(ledger, analysed)
        seconds = median_seconds(run, ledger, now, repeats)
    # This process's own peak (VmHWM): ru_maxrss would count the parent's memory the spawn forked before its exec.
    peak_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    return seconds, peak_kb / 1024


def heavy(args: argparse.Namespace) -> None:
    from helpers.heavy_ledger import heavy_commands

    part = RECENT_DAYS / 365
    ledgers = {"year": heavy_ledger_of(args.jobs, 365), "recent": heavy_ledger_of(round(args.jobs * part), RECENT_DAYS)}
    names = list(heavy_commands(load_site("dev"), {}))
    results: dict[tuple[str, bool, str], tuple[float, float]] = {}
    pool = multiprocessing.get_context("spawn")
    for analysed in (False, True):
        for which, (path, now, ids) in ledgers.items():
            for name in names:
                with pool.Pool(1) as child:
                    results[which, analysed, name] = child.apply(_heavy_child, (path, now, ids, name, analysed,
                                                                                args.repeats))
    size_gb = ledgers["year"][0].stat().st_size / 2**30
    print(f"heavy mix, {args.jobs:,} jobs ({size_gb:.1f} GiB), median of {args.repeats}: s (peak RSS MiB)")
    print(f"  {'command':34}{'no statistics':>22}{'analysed':>22}{'year/40 days':>14}")
    for name in names:
        cells = [f"{results['year', a, name][0]:9.3f} ({results['year', a, name][1]:4.0f})" for a in (False, True)]
        ratio = results["year", False, name][0] / results["recent", False, name][0]
        print(f"  {name:34}{cells[0]:>22}{cells[1]:>22}{ratio:14.2f}")
        goal = 2.0 if "30" in name else 1.0
        for analysed in (False, True):
            seconds, rss = results["year", analysed, name]
            how = "analysed" if analysed else "no statistics"
            figure(f"heavy {name}, {args.jobs:,} jobs, {how}", seconds, "s", f"<= {goal:g} s (issue 41)",
                   seconds <= goal)
            figure(f"heavy {name}, peak RSS, {how}", rss, "MiB", "<= 200 MiB (issue 41)", rss <= 200)
        figure(f"heavy {name}, a year / its last {RECENT_DAYS} days", ratio, "x", "<= 1.3 (issue 41)", ratio <= 1.3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--sweeps", type=int, default=10_000)
    parser.add_argument("--metrics", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--heavy", action="store_true", help="a heavy user's year (issue 41)")
    args = parser.parse_args()
    if args.heavy:
        heavy(args)
        return
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
