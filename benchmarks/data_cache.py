"""The node's shard cache (issue 62) against reading a slow source directly, in one run.

    .venv/bin/python benchmarks/data_cache.py [--size-mb 1024] [--shard-mb 32] [--rate-mb 200] [--repeats 3]

The source: each shard behind `pipe:` tests/helpers/slow_source.py, which writes it at --rate-mb MB/s a stream
(a parallel file system's share of bandwidth for one reader), the dataset packed once under /var/tmp. Each repeat:
  direct       one epoch of the loader (2 workers, undecoded, reused buffers) reading the source;
  first epoch  the same through an empty cache: every shard fetched, verified and read from the copy;
  second epoch the same again, WARM_EPOCHS times: every shard from the cache;
  raw read     the cached copies read by 2 processes, each the bytes its loader worker reads (benchmarks/data_loader.py's
               baseline), from the page cache as the second epoch is, WARM_EPOCHS times.
Goals: the second epoch's throughput >= 0.9 x the raw read's (from its first round of batches to its last, as
data_loader.py measures a loader); the first epoch's time <= 1.05 x the direct epoch's. And the source bytes of a
20-trial sweep on one node: with the cache, the sum of 20 loaders' `cache_source_bytes`; without it, 20 x the bytes
the direct epoch read from the source (its pipe reads, counted). The sweep's trials run one after another from an
empty cache.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _figures import figure  # noqa: E402
from data_loader import dataset, one_epoch, raw_read, spread, timed, worker_ranges  # noqa: E402
from helpers.slow_source import reads, slow_index  # noqa: E402

from hpctrain.data import ShardLoader  # noqa: E402
from hpctrain.data.cache import ShardCache  # noqa: E402

KW = dict(batch_size=8, workers=2, decode=False, reuse_buffers=True)
TRIALS = 20
WARM_EPOCHS = 5  # an epoch from the page cache takes a tenth of a second: five, summed, are read as one figure


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--shard-mb", type=int, default=32)
    ap.add_argument("--rate-mb", type=float, default=200.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/hpctrain-bench-cache-data"))
    args = ap.parse_args()
    index = dataset(args.dir / f"{args.size_mb}", args.size_mb << 20, 256 << 10, args.shard_mb << 20)
    total = sum(s.bytes for s in index.shards)
    work = Path(tempfile.mkdtemp(prefix="hpctrain-bench-cache-"))
    try:
        log = work / "reads.log"
        slow = slow_index(index, work / "slow" / "index.json", log, args.rate_mb * 1e6)
        direct, first, second, raw = [], [], [], []
        read_direct = 0
        for _ in range(args.repeats):
            before = len(reads(log))
            direct.append(timed(lambda: one_epoch(ShardLoader(slow, **KW))).seconds)
            read_direct = sum(index.shards[int(n.split("-")[1].split(".")[0])].bytes
                              for n, _ in reads(log)[before:])
            shutil.rmtree(work / "cache", ignore_errors=True)
            cache = ShardCache(work / "cache")
            loader = ShardLoader(slow, **KW, cache=cache)
            first.append(timed(lambda: one_epoch(loader)).seconds)
            os.sync()  # the copies' pages written back: their writeback is the first epoch's, not the second's
            copies = [[(cache.path(index.shards[_shard(index, p)].sha256), a, b) for p, a, b in ranges]
                      for ranges in worker_ranges(index, KW["workers"], KW["batch_size"])]
            epochs, raw_s = [], 0.0
            for _ in range(WARM_EPOCHS):  # side by side, so that the machine's drift falls on both
                epochs.append(one_epoch(loader))
                raw_s += timed(lambda: raw_read(copies)).seconds
            second.append(sum(e.steady_bytes for e in epochs) / sum(e.steady for e in epochs))
            raw.append(WARM_EPOCHS * total / raw_s)
        sweep = 0
        shutil.rmtree(work / "cache", ignore_errors=True)  # the sweep's first trial finds the cache empty
        for _ in range(TRIALS):
            trial = ShardLoader(slow, **KW, cache=ShardCache(work / "cache"))
            one_epoch(trial)
            sweep += trial.stats.cache.source_bytes
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mb = 1e6
    print(f"{len(index.shards)} shards, {total / mb:.0f} MB, source {args.rate_mb:g} MB/s a stream, "
          f"median (min-max) of {args.repeats}")
    print(f"  direct epoch        {spread(direct, '.2f')} s")
    print(f"  first epoch, cached {spread(first, '.2f')} s")
    print(f"  second epoch        {spread([r / mb for r in second], '.0f')} MB/s")
    print(f"  raw read of copies  {spread([r / mb for r in raw], '.0f')} MB/s")
    print(f"  direct, as a rate   {spread([total / d / mb for d in direct], '.0f')} MB/s (the whole epoch)")
    overhead = statistics.median(f / d for f, d in zip(first, direct))
    ratio = statistics.median(s / r for s, r in zip(second, raw))
    figure("cache: second epoch vs raw read", round(ratio, 3), "x", goal=">= 0.9", met=ratio >= 0.9)
    figure("cache: first epoch vs direct", round(overhead, 3), "x", goal="<= 1.05", met=overhead <= 1.05)
    print(f"  a {TRIALS}-trial sweep's source bytes: {sweep / mb:.0f} MB with the cache, "
          f"{TRIALS * read_direct / mb:.0f} MB without ({TRIALS * read_direct / max(sweep, 1):.0f}x)")
    figure(f"cache: {TRIALS}-trial sweep source bytes", round(sweep / mb, 1), "MB",
           goal=f"1 x the dataset ({total / mb:.0f} MB)", met=sweep <= total)


def _shard(index, path: Path) -> int:
    return next(i for i, s in enumerate(index.shards) if index.shard_path(s) == path)


if __name__ == "__main__":
    main()
