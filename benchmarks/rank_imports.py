"""What a rank's imports cost before it trains a step: CPU-seconds of a fresh interpreter importing the trainer's
modules, against `import torch` alone (the floor every rank pays), and of the modules a checkpoint command loads.
Every rank pays it at its start and at each in-place restart; the test suite pays it for every rank it starts.

    .venv/bin/python benchmarks/rank_imports.py [--runs 7] [--other-ml-dtypes DIR]

--other-ml-dtypes DIR: also time the same imports with the ml_dtypes installed in DIR first on the path
(`pip install --no-deps --target DIR ml_dtypes==0.7.0`), interleaved run by run with the installed one. 0.7.0's
extension took 0.5 CPU-s to load here, 0.6.0's 0.05 s: setup.cfg keeps ml_dtypes below 0.7.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys

from _figures import figure

FLOOR, RANK, ML_DTYPES = "import torch (baseline)", "a rank's imports (hpctrain.train)", "import ml_dtypes"
CASES = {
    FLOOR: "import torch, torch.distributed",
    RANK: (
        "import hpctrain.train.engine, hpctrain.train.state, hpctrain.train.dataset, "
        "hpctrain.train.checkpointing, hpctrain.train.evaluation"
    ),
    "a checkpoint command's (hpctrain.checkpoint.format)": "import hpctrain.checkpoint.format",
    ML_DTYPES: "import ml_dtypes",
}


def cpu_seconds(code: str, path: str | None) -> float:
    """User + system CPU-seconds of a fresh interpreter running ``code`` (``path`` first on PYTHONPATH)."""
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [path, env.get("PYTHONPATH")]))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True, env=env, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def version(path: str | None) -> str:
    env = {**os.environ, **({"PYTHONPATH": path} if path else {})}
    code = "import ml_dtypes; print(ml_dtypes.__version__)"
    return subprocess.run(
        [sys.executable, "-c", code], check=True, env=env, capture_output=True, text=True
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--other-ml-dtypes", metavar="DIR", help="a folder with another ml_dtypes, timed beside")
    args = parser.parse_args()
    paths = {f"ml_dtypes {version(None)}": None}
    if args.other_ml_dtypes:
        paths[f"ml_dtypes {version(args.other_ml_dtypes)}"] = args.other_ml_dtypes
    times: dict[tuple[str, str], list[float]] = {(c, p): [] for c in CASES for p in paths}
    for _ in range(args.runs):  # interleaved: the machine's drift hits every case alike
        for case, code in CASES.items():
            for label, path in paths.items():
                times[case, label].append(cpu_seconds(code, path))
    median = {key: statistics.median(v) for key, v in times.items()}
    print(f"{'CPU-s, median of ' + str(args.runs):52}" + "".join(f"{label:>18}" for label in paths))
    for case in CASES:
        print(f"{case:52}" + "".join(f"{median[case, label]:18.2f}" for label in paths))
    installed = next(iter(paths))
    rank, floor = median[RANK, installed], median[FLOOR, installed]
    print(f"a rank's imports beyond torch's: {rank - floor:.2f} CPU-s ({installed})")
    figure("a rank's imports", rank, "CPU-s")
    figure("a rank's imports vs import torch", rank / floor, "x")
    figure(ML_DTYPES, median[ML_DTYPES, installed], "CPU-s", "<= 0.15", median[ML_DTYPES, installed] <= 0.15)
    for label in list(paths)[1:]:
        figure(f"a rank's imports with {label} vs {installed}", median[RANK, label] / rank, "x")


if __name__ == "__main__":
    main()
