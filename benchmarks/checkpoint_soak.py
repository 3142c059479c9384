"""Soak: does a training run's memory stay level over many checkpoints and restarts?

    .venv/bin/python benchmarks/checkpoint_soak.py [--mode async|sync|both] [--attempts 3] [--saves 10]

The reference trainer (`python -m hpctrain.train`: GPT, 12 layers, hidden 1024, tp=2 x pp=2 on 4 ranks
under torchrun, WebDataset shards, a checkpoint every 2 steps, keep 3) is stopped by a preemption
notice (SIGUSR2 to every rank, as Slurm's `--signal` sends it) once it has committed ``--saves``
checkpoints, then started again, resuming: ``--attempts`` runs in all. One rank's shard of the state
is about 450 MB. The trainer is watched from outside: every rank's resident memory (VmRSS) is read
from /proc every 50 ms, and its floor between one commit and the next (what stays when no save's
copy and no step's activations are held) is taken per save; the growth per save is the median slope
of a rank's floors over one run, its first saves left out (see ``growth_per_save``). Goal: no growth
beyond noise (under 5 % of a shard per save) on every rank of every resumed run (the fresh run is shown,
not judged: its floors step up where the allocator keeps its first peaks). A state kept per save grows
by a whole shard per save.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpctrain.checkpoint.naming import list_dirs
from hpctrain.config.job import Model
from hpctrain.train.dataset import pack_token_dataset

from _figures import figure

TORCHRUN = Path(sys.executable).with_name("torchrun")
WORLD = 4
WARMUP = 3  # saves of each run left out of the growth
SPEC = """\
name = "bench-soak"
command = ["python", "-m", "hpctrain.train"]
seed = 3
[resources]
gpus_per_node = 4
[parallel]
tp = 2
pp = 2
micro_batch = 1
grad_accum = 1
[model]
layers = {layers}
heads = 8
hidden = {hidden}
vocab = 256
seq_len = 16
[data]
index = "{index}"
workers = 1
[checkpoint]
dir = "{ckpt}"
every_steps = 2
keep_last = 3
async = {async_}
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return int(next(line for line in status if line.startswith("VmRSS:")).split()[1]) / 1024


def ranks_of(launcher: subprocess.Popen[bytes]) -> dict[int, int]:
    """torchrun's worker processes by RANK (empty until all have started)."""
    try:
        with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children", encoding="ascii") as fh:
            children = [int(p) for p in fh.read().split()]
        found = {}
        for pid in children:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            rank = next((v[5:] for v in env if v.startswith(b"RANK=")), None)
            if rank is not None:
                found[int(rank)] = pid
        return found if len(found) == WORLD else {}
    except (OSError, ValueError):
        return {}


def attempt(spec: Path, ckpt: Path, saves: int, log: Path) -> tuple[int, dict[int, list[float]]]:
    """One run until it has committed ``saves`` checkpoints, then stopped by a notice: (step it resumed
    at, each rank's floor of RSS in MB between one commit and the next)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
    cmd = [str(TORCHRUN), "--standalone", f"--nproc-per-node={WORLD}", "-m", "hpctrain.train",
           "--spec", str(spec), "--steps", "1000000"]
    seen = {d.path.name for d in list_dirs(ckpt)}
    start = max((d.step for d in list_dirs(ckpt)), default=0)
    with open(log, "ab") as out:
        launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=out, env=env)
    floors: dict[int, list[float]] = {}
    ranks: dict[int, int] = {}
    low: dict[int, float] = {}  # since the last commit
    commits = 0
    while commits < saves and launcher.poll() is None:
        time.sleep(0.05)
        ranks = ranks or ranks_of(launcher)
        if not ranks:
            continue
        for rank, pid in ranks.items():
            low[rank] = min(low.get(rank, float("inf")), rss_mb(pid))
        new = [d for d in list_dirs(ckpt) if d.path.name not in seen]
        if new:
            seen.update(d.path.name for d in new)
            commits += len(new)
            if commits > 1:  # the first interval holds the start-up
                for rank in ranks:
                    floors.setdefault(rank, []).append(low[rank])
            low = {}
    if commits == saves:
        for pid in ranks.values():  # the notice, to every rank
            os.kill(pid, signal.SIGUSR2)
    if launcher.wait(600) != 0 or commits < saves:
        raise SystemExit(f"the trainer failed (exit {launcher.returncode}):\n{log.read_text()[-3000:]}")
    return start, floors


def growth_per_save(floors: list[float]) -> float:
    """Theil-Sen slope (the median of the slopes between every two saves) of the floors after the first
    WARMUP: the allocator keeps some of a run's first peaks (a step up, once), a state kept per save
    climbs at every save."""
    ys = floors[WARMUP:]
    return statistics.median((ys[j] - ys[i]) / (j - i) for i in range(len(ys)) for j in range(i + 1, len(ys)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--attempts", type=int, default=3, help="runs: the first fresh, the others resumed")
    parser.add_argument("--saves", type=int, default=10, help="checkpoints committed per run before its notice "
                        f"(more than {WARMUP + 2})")
    parser.add_argument("--mode", choices=("async", "sync", "both"), default="both", help="saves (default: both)")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    model = Model(layers=args.layers, heads=8, hidden=args.hidden, vocab=256, seq_len=16)
    # weights and two AdamW moments, fp32, split over tp x pp
    shard_mb = 3 * 4 * 12 * args.layers * args.hidden ** 2 / WORLD / 2 ** 20
    for mode in ("async", "sync") if args.mode == "both" else (args.mode,):
        soak(model, mode, args.attempts, args.saves, shard_mb)


def soak(model: Model, mode: str, attempts: int, saves: int, shard_mb: float) -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp)
        index = pack_token_dataset(root / "data", model, seed=3, count=400, shard_bytes=64 << 10).path
        spec = root / "spec.toml"
        spec.write_text(SPEC.format(layers=model.layers, hidden=model.hidden, index=index, ckpt=root / "ck",
                                    async_=str(mode == "async").lower()))
        print(f"{mode} saves, a shard of about {shard_mb:.0f} MB per rank; "
              "the floor of RSS in MB from each commit to the next")
        worst = {"fresh": 0.0, "resumed": 0.0}
        for run in range(attempts):
            start, rss = attempt(spec, root / "ck", saves, root / "trainer.log")
            print(f"run {run + 1} ({'fresh' if not start else f'resumed at step {start}'}):")
            for rank in sorted(rss):
                growth = growth_per_save(rss[rank])
                kind = "resumed" if start else "fresh"
                worst[kind] = max(worst[kind], growth)
                print(f"  rank {rank}: {' '.join(f'{v:.0f}' for v in rss[rank])}   "
                      f"growth {growth:+.1f} MB/save ({growth / shard_mb:+.1%} of a shard)", flush=True)
    met = worst["resumed"] < 0.05 * shard_mb
    figure(f"RSS growth per {mode} save after a resume, worst rank and run", worst["resumed"], "MB",
           goal=f"< {0.05 * shard_mb:.1f} MB (5% of a shard)", met=met)
    figure(f"RSS growth per {mode} save after a resume / shard", worst["resumed"] / shard_mb, "x", goal="< 0.05",
           met=met)
    figure(f"RSS growth per {mode} save in the fresh run, worst rank", worst["fresh"], "MB")

if __name__ == "__main__":
    main()
