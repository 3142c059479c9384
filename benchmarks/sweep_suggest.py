"""The pure part of a sweep tick over 10,000 trials: suggesting new trials and early-stopping decisions.

    .venv/bin/python benchmarks/sweep_suggest.py [--trials 10000] [--points 20] [--repeats 5]

suggest() runs on a history of --trials completed trials, for each method; trials_to_stop() on
--trials running trials with --points intermediate values each (the worst case: every trial is
judged). Figures are medians over the repeats. Goal: a tick (the slowest suggest plus the slowest
trials_to_stop) well under 2 s, leaving the rest of the 2 s to the ledger and Slurm side.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from typing import Any, Callable

from hpctrain.sweep import methods
from hpctrain.sweep.methods import TrialRecord, suggest
from hpctrain.sweep.spec import SweepSpec
from hpctrain.sweep.stopping import trials_to_stop

from _figures import figure


SEARCH = {
    "lr": {"type": "loguniform", "low": 1e-5, "high": 1e-1},
    "dropout": {"type": "uniform", "low": 0.0, "high": 0.5},
    "batch": {"type": "choice", "values": [16, 32, 64, 128]},
    "layers": {"type": "int", "low": 2, "high": 48, "step": 2},
}


def make_spec(method: str, max_trials: int, **kw: Any) -> SweepSpec:
    return SweepSpec.model_validate({
        "name": "bench", "job": "train.toml", "method": method, "metric": "loss", "direction": "minimize",
        "search": SEARCH, "max_trials": max_trials, **kw,
    })


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm up: lazy imports
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def loss(p: dict[str, Any]) -> float:
    return (math.log10(p["lr"]) + 3) ** 2 + p["dropout"] + p["layers"] / 48


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n, rng = args.trials, random.Random(0)

    budget = 2 * n
    history = [TrialRecord(k, p, "completed", loss(p)) for k, p in enumerate(suggest(make_spec("random", n), [], n))]
    grid = make_spec("grid", budget, search={"a": {"type": "choice", "values": list(range(100))},
                                             "b": {"type": "int", "low": 0, "high": 999}})
    rand, bayes = make_spec("random", budget), make_spec("bayes", budget)
    cases: dict[str, Callable[[], object]] = {
        "suggest grid, n=1": lambda: suggest(grid, history, 1),
        "suggest random, n=1": lambda: suggest(rand, history, 1),
        "suggest random, n=100": lambda: suggest(rand, history, 100),
        "suggest bayes, n=0": lambda: suggest(bayes, history, 0),
        "suggest bayes, max_trials reached": lambda: suggest(make_spec("bayes", n), history, 8),
        "suggest bayes, n=1": lambda: suggest(bayes, history, 1),
        "suggest bayes, n=8": lambda: suggest(bayes, history, 8),
    }
    results = {name: median_seconds(fn, args.repeats) for name, fn in cases.items()}
    window, methods.TPE_WINDOW = methods.TPE_WINDOW, n + 1
    results["suggest bayes, n=1, whole history (no window)"] = median_seconds(lambda: suggest(bayes, history, 1), 1)
    methods.TPE_WINDOW = window

    running = []
    for k in range(n):
        floor = rng.random()
        steps = range(10, 10 * args.points + 1, 10)
        running.append(TrialRecord(k, {}, "running", None, {s: floor + 10 / s + 0.01 * rng.random() for s in steps}))
    for rule in ("median", "halving"):
        spec = make_spec("random", budget, early_stopping={"rule": rule, "min_resource": 10} if rule == "halving" else {"rule": rule})
        results[f"trials_to_stop {rule}, {args.points} points each"] = median_seconds(
            lambda: trials_to_stop(spec, running), args.repeats)

    print(f"{n} trials, TPE window {methods.TPE_WINDOW} (+ the best 25)")
    print(f"{'case':52} {'median ms':>10}")
    for name, secs in results.items():
        print(f"{name:52} {secs * 1000:10.2f}")
    tick = max(v for k, v in results.items() if k.startswith("suggest") and "no window" not in k)
    tick += max(v for k, v in results.items() if k.startswith("trials_to_stop"))
    print(f"slowest suggest + slowest trials_to_stop: {tick:.3f} s; goal: tick < 2 s -> {'met' if tick < 2 else 'MISSED'}")
    figure(f"slowest suggest + trials_to_stop, {n} trials", tick, "s", "< 2 s", tick < 2)


if __name__ == "__main__":
    main()
