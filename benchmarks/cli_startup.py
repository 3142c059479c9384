"""Start-up time of the login-node CLI against a bare interpreter, measured in the same run.

    .venv/bin/python benchmarks/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from _figures import figure


CASES = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "python -c 'import click'": [sys.executable, "-c", "import click"],
    "hpctrain --help": [sys.executable, "-m", "hpctrain", "--help"],
    "hpctrain version": [sys.executable, "-m", "hpctrain", "version"],
}


def median_seconds(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    results = {name: median_seconds(argv, args.runs) for name, argv in CASES.items()}
    base = results["python -c pass (baseline)"]
    print(f"{'case':32} {'median s':>9} {'x baseline':>11}")
    for name, secs in results.items():
        print(f"{name:32} {secs:9.3f} {secs / base:11.2f}")
    print(f"goal: hpctrain --help well under 0.5 s -> {'met' if results['hpctrain --help'] < 0.5 else 'MISSED'}")
    figure("hpctrain --help", results["hpctrain --help"], "s", "< 0.5 s", results["hpctrain --help"] < 0.5)
    figure("hpctrain --help vs python -c pass", results["hpctrain --help"] / base, "x")


if __name__ == "__main__":
    main()
