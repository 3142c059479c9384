"""Start-up time of the login-node CLI against a bare interpreter, measured in the same run; with
``--against REV``, also against hpctrain as it was at git revision REV (a temporary worktree on PYTHONPATH,
its runs interleaved with today's).

    .venv/bin/python benchmarks/cli_startup.py [--runs 15] [--against c8d8aa9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _figures import figure


CASES = {
    "python -c pass (baseline)": [sys.executable, "-c", "pass"],
    "python -c 'import click'": [sys.executable, "-c", "import click"],
    "hpctrain --help": [sys.executable, "-m", "hpctrain", "--help"],
    "hpctrain version": [sys.executable, "-m", "hpctrain", "version"],
    "hpctrain submit --help": [sys.executable, "-m", "hpctrain", "submit", "--help"],
}
HPCTRAIN_CASES = [name for name in CASES if name.startswith("hpctrain")]
REPO = Path(__file__).resolve().parent.parent


def run_once(argv: list[str], env: dict[str, str] | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env, cwd=tempfile.gettempdir())
    return time.perf_counter() - t0


def medians(cases: dict[str, list[str]], runs: int, tree: Path | None) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds of each case today, and (with ``tree``) of the hpctrain cases run from that tree; the two
    alternate run by run so that drift of the machine hits both alike."""
    then_env = {**os.environ, "PYTHONPATH": str(tree)} if tree else None
    now: dict[str, list[float]] = {name: [] for name in cases}
    then: dict[str, list[float]] = {name: [] for name in HPCTRAIN_CASES if tree}
    for _ in range(runs):
        for name, argv in cases.items():
            now[name].append(run_once(argv, {**os.environ, "PYTHONPATH": str(REPO)}))
            if name in then:
                then[name].append(run_once(argv, then_env))
    return ({k: statistics.median(v) for k, v in now.items()}, {k: statistics.median(v) for k, v in then.items()})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--against", metavar="REV", help="also time the CLI as it was at this git revision")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree" if args.against else None
        if tree is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), args.against],
                           check=True)
        try:
            results, before = medians(CASES, args.runs, tree)
        finally:
            if tree is not None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=True)
    base = results["python -c pass (baseline)"]
    print(f"{'case':32} {'median s':>9} {'x baseline':>11}" + (f" {args.against + ' s':>12} {'now/then':>9}" if before else ""))
    for name, secs in results.items():
        then = f" {before[name]:12.3f} {secs / before[name]:9.3f}" if name in before else ""
        print(f"{name:32} {secs:9.3f} {secs / base:11.2f}{then}")
    print(f"goal: hpctrain --help well under 0.5 s -> {'met' if results['hpctrain --help'] < 0.5 else 'MISSED'}")
    figure("hpctrain --help", results["hpctrain --help"], "s", "< 0.5 s", results["hpctrain --help"] < 0.5)
    figure("hpctrain --help vs python -c pass", results["hpctrain --help"] / base, "x")
    if before:
        worst = max(results[n] / before[n] for n in before)
        print(f"goal: start-up within 10% of {args.against} -> {'met' if worst <= 1.10 else 'MISSED'} (worst {worst:.3f}x)")
        figure(f"CLI start-up vs {args.against} (worst case)", worst, "x", "<= 1.10", worst <= 1.10)


if __name__ == "__main__":
    main()
