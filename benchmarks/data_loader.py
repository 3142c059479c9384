"""ShardLoader throughput against a raw sequential read of the same shards, and resume time vs position.

    python benchmarks/data_loader.py --size-gb 1 [--dir /var/tmp/hpctrain-bench-data] [--workers 2]

Packs ``--size-gb`` of .npy samples once (kept in --dir for later runs), then measures, cold (page
cache dropped for the shards with posix_fadvise) and warm: a raw 8 MiB-block read of every shard,
the loader without decoding, and the loader decoding .npy into batched tensors. Goals: undecoded
loader >= 0.9 x raw; resume time flat in the position resumed from.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from hpctrain.data import ShardIndex, ShardLoader, load_index, pack  # noqa: E402

from _figures import figure



def dataset(root: Path, size: int, sample_bytes: int, shard_bytes: int) -> ShardIndex:
    if (root / "index.json").exists():
        index = load_index(root / "index.json")
        if sum(s.bytes for s in index.shards) >= size:
            return index
    values = sample_bytes // 4
    samples = ({"__key__": f"s{i:08d}", "npy": np.full(values, i, dtype=np.float32)}
               for i in range(-(-size // sample_bytes)))
    return pack(samples, root, shard_bytes=shard_bytes)


def drop_cache(index: ShardIndex) -> None:
    for shard in index.shards:
        fd = os.open(index.shard_path(shard), os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def raw_read(index: ShardIndex) -> None:
    for shard in index.shards:
        with open(index.shard_path(shard), "rb", buffering=0) as fh:
            while fh.read(8 << 20):
                pass


def one_epoch(loader: ShardLoader) -> None:
    for _ in loader:
        pass


def timed(index: ShardIndex, run, cold: bool) -> float:
    if cold:
        drop_cache(index)
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def first_batch_after_resume(index: ShardIndex, kw: dict, batches: int) -> float:
    loader = ShardLoader(index, **kw)
    for _ in itertools.islice(loader, batches):
        pass
    state = loader.state_dict()
    start = time.perf_counter()
    fresh = ShardLoader(index, **kw)
    fresh.load_state_dict(state)
    next(iter(fresh))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/hpctrain-bench-data"))
    ap.add_argument("--sample-kb", type=int, default=1024)
    ap.add_argument("--shard-mb", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--shuffle-buffer", type=int, default=64)
    args = ap.parse_args()

    index = dataset(args.dir, int(args.size_gb * 1e9), args.sample_kb << 10, args.shard_mb << 20)
    total = sum(s.bytes for s in index.shards)
    print(f"{len(index.shards)} shards, {index.total_samples} samples, {total / 1e9:.2f} GB in {args.dir}; "
          f"workers={args.workers} batch={args.batch_size} shuffle_buffer={args.shuffle_buffer}")
    kw = dict(batch_size=args.batch_size, workers=args.workers, shuffle_buffer=args.shuffle_buffer)

    runs = {
        "raw sequential read": lambda: raw_read(index),
        "loader, undecoded": lambda: one_epoch(ShardLoader(index, decode=False, **kw)),
        "loader, .npy decoded": lambda: one_epoch(ShardLoader(index, **kw)),
    }
    for cache in ("cold", "warm"):
        raw_read(index)  # warms the cache for the warm pass; the cold pass drops it per run
        seconds = {name: timed(index, run, cache == "cold") for name, run in runs.items()}
        raw = seconds["raw sequential read"]
        for name, s in seconds.items():
            print(f"{cache:4} {name:22} {total / s / 1e6:8.0f} MB/s  {raw / s:5.2f} x raw")
        ratio = raw / seconds["loader, undecoded"]
        figure(f"loader (undecoded) vs raw read, {cache} cache", ratio, "x raw", ">= 0.9 x raw", ratio >= 0.9)

    per_epoch = len(ShardLoader(index, **kw))
    print("resume: seconds from load_state_dict to the first batch, by batches already consumed")
    base = None
    for fraction in (0.0, 0.25, 0.5, 0.75, 0.95):
        batches = int(fraction * per_epoch)
        s = first_batch_after_resume(index, kw, batches)
        base = base or s
        print(f"  {batches:6d} of {per_epoch} batches: {s:6.3f} s  {s / base:5.2f} x position 0")
    figure("resume at 95 % of an epoch vs at its start", s / base, "x", "flat (< 2 x)", s / base < 2)


if __name__ == "__main__":
    main()
