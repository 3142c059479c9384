"""kill -9 of a save at random points: the newest valid checkpoint must always load whole and be right.

    .venv/bin/python benchmarks/checkpoint_crash.py [--trials 100] [--ranks 2] [--rows 2048] [--seed 0] [--dir DIR]

Each trial starts the crash writer of the test suite (tests/helpers/checkpoint.py): ``--ranks`` ranks as
threads of one process, each writing its row shards (about ``--rows`` KiB per rank), rank 0 also a
replicated tensor. It resumes from what the previous trial left, checking it, then makes one save (odd
steps async) and is SIGKILLed after a random delay, drawn with a fixed seed uniformly over 1.1 times a
save's duration (measured first; the extra tenth covers the writer's exit). Then ``latest_valid``
must name the step of the killed save or the one before, and that checkpoint must verify and hold
exactly every rank's state of its step. The phase each kill hit is told from the files it left.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _figures import figure  # noqa: E402
from helpers.checkpoint import check_checkpoint, start_crash_writer  # noqa: E402
from hpctrain.checkpoint import latest_valid  # noqa: E402
from hpctrain.checkpoint.naming import MANIFEST, TENSORS, committed_name, list_dirs, parse  # noqa: E402

PHASES = ("before tmp dir", "tmp dir, no chunk yet", "writing arrays", "some ranks' fragments",
          "before manifest", "before rename", "after rename", "after the writer finished")


def phase(directory: Path, step: int, world: int, finished: bool) -> str:
    """How far the save of ``step`` got before the kill, from the files it left in ``directory``."""
    if (directory / committed_name(step)).is_dir():
        return PHASES[7] if finished else PHASES[6]
    tmp = [d.path for d in list_dirs(directory, kind="tmp") if d.step == step]
    if not tmp:
        return PHASES[0]
    names = {p.name for d in tmp for p in d.iterdir()}
    fragments = sum(f"rank-{r}.json" in names for r in range(world))
    if MANIFEST in names:
        return PHASES[5]
    if fragments == world:
        return PHASES[4]
    if fragments:
        return PHASES[3]
    chunks = any(p.is_file() and p.name != "zarr.json" for d in tmp for p in (d / TENSORS).rglob("*"))
    return PHASES[2] if chunks else PHASES[1]


def newest_step(directory: Path) -> int | None:
    committed = list_dirs(directory)
    return committed[-1].step if committed else None


def save_seconds(directory: Path, world: int, rows: int, runs: int = 3) -> float:
    """Median duration of one save (from the writer's 'ready' to its 'saved')."""
    times = []
    for _ in range(runs):
        child = start_crash_writer(directory, world, rows, saves=1)
        start = time.perf_counter()
        line = child.stdout.readline()
        times.append(time.perf_counter() - start)
        child.wait()
        if line != "saved\n" or child.returncode:
            raise RuntimeError(f"the crash writer failed:\n{child.stderr.read()}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--ranks", type=int, default=2, help="ranks (threads of the writer process), default 2")
    parser.add_argument("--rows", type=int, default=2048, help="rows per rank's shards: ~1 KiB each (default 2048)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to write (a temp dir is made inside)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="hpctrain-crash-", dir=args.dir))
    directory = work / "ck"
    rng = random.Random(args.seed)
    phases: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    failures: list[str] = []
    started = time.perf_counter()
    try:
        duration = save_seconds(directory, args.ranks, args.rows)
        for trial in range(args.trials):
            before = newest_step(directory)
            assert before is not None
            child = start_crash_writer(directory, args.ranks, args.rows, saves=1)
            time.sleep(rng.uniform(0, 1.1 * duration))
            finished = child.poll() is not None
            child.kill()
            child.wait()
            phases[phase(directory, before + 1, args.ranks, finished)] += 1
            latest = latest_valid(directory)
            step = parse(latest).step if latest is not None else None
            if step not in (before, before + 1):
                outcomes["wrong"] += 1
                failures.append(f"trial {trial}: latest_valid gave {latest} after a save of step {before + 1}")
                continue
            outcomes["killed" if step == before + 1 else "before"] += 1
            try:
                check_checkpoint(latest, step, args.ranks, args.rows)
            except Exception as exc:  # noqa: BLE001 - every way of failing to load counts
                outcomes["unloadable"] += 1
                failures.append(f"trial {trial}: {latest.name}: {type(exc).__name__}: {exc}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    elapsed = time.perf_counter() - started

    print(f"{args.trials} trials: {args.ranks} ranks x ~{args.rows} KiB, one save each (odd steps async), "
          f"{duration:.3f} s per save (median of 3); kill delays uniform over 0..{1.1 * duration:.3f} s, "
          f"seed {args.seed}; dir {args.dir}")
    print("kill points (from the files left on disk):")
    for name in PHASES:
        print(f"  {name:28} {phases[name]:4}")
    print(f"latest_valid gave: the killed save's step {outcomes['killed']}, the step before {outcomes['before']}, "
          f"another or none {outcomes['wrong']}")
    bad = outcomes["unloadable"] + outcomes["wrong"]
    print(f"unloadable latest checkpoints: {bad} (goal 0)")
    for failure in failures[:10]:
        print(f"  {failure}")
    print(f"time: {elapsed:.1f} s ({elapsed / args.trials:.2f} s per trial)")
    figure(f"unloadable latest checkpoints after {args.trials} kill -9 of a save", bad, "trials", "0", bad == 0)


if __name__ == "__main__":
    main()
