"""ShardLoader throughput against a raw read at the same parallelism, cold and warm cache; resume time vs position.

    .venv/bin/python benchmarks/data_loader.py [--size-gb 4] [--dir DIR] [--workers 2] [--repeats 5]

Packs --size-gb of .npy samples once (kept in --dir, default /var/tmp/hpctrain-bench-data, for later runs).
The baseline, "raw read, N streams", is N processes (N = --workers), process w reading with 8 MiB reads the
bytes of what the loader's worker w reads in epoch 0: its segments of hpctrain.data.plan.plan_epoch (the
loader's own plan), a sample range taken as the proportional byte range (the samples are all one size),
forked as the DataLoader forks its workers. Against it: the loader without decoding (batches of the stored
bytes, ``decode=False``), the same with ``reuse_buffers=True`` (each worker writes its batches into a few
shared-memory buffers it reuses), and the loader decoding .npy into batched tensors. Each repeat runs the four
cases in an order rotated from repeat to repeat. Cold: the shards' cached pages are dropped with
posix_fadvise(DONTNEED) before each case, so reads come from the device (or the caches below a virtual disk),
and the raw read asks the kernel to read ahead as far as the loader does (posix_fadvise(WILLNEED) 32 MiB past
each read); warm: everything from the page cache, after one raw read, which then asks for no readahead.

Throughput: a raw read's bytes over its time from start to end (its processes' fork included); a loader's
bytes after its first round of batches (one per worker) over the time from that round to the last batch, since
a loader starts its workers once per epoch (about 40 ms, and the first touch of each worker's batch buffers, 1.6
us a page on this virtual machine) and an epoch of a rank's share is gigabytes to terabytes: each loader's whole
epoch against the raw read, and its workers' start and stop, are shown beside it. Figures: each case's median over
--repeats and its spread (min-max); a ratio is of the medians, its spread that of the ratios within each repeat
(this machine's disk and memory bandwidth drift from run to run more than the cases differ: only cases run side by
side compare). Goal: the undecoded loader's throughput >= 0.9 x the raw read's at equal parallelism, cold and warm.
With each case, the CPU time (user, sys) of all its processes and their minor page faults per MB: without
reused buffers every batch a DataLoader worker hands over is a new shared-memory segment, 256 faults per MiB,
which here cost more than reading the bytes; with them, the worker reads a local shard's bytes straight into
its buffer (one copy, as the raw read). Resume: seconds from a fresh loader's load_state_dict to its first
batch (median over the repeats), by the position resumed at; goal: flat (at 95 % of the epoch < 2 x at its
start).
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing
import os
import resource
import statistics
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from hpctrain.data import ShardIndex, ShardLoader, load_index, pack  # noqa: E402
from hpctrain.data.plan import plan_epoch  # noqa: E402
from hpctrain.data.tarshard import HINT_STEP, READ_AHEAD  # noqa: E402

from _figures import figure  # noqa: E402

BLOCK = 8 << 20
GOAL = 0.9
Range = tuple[Path, int, int]  # a shard, and the bytes [start, end) of it read


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


def worker_ranges(index: ShardIndex, workers: int, batch_size: int) -> list[list[Range]]:
    """Per loader worker, the bytes of the shards it reads in epoch 0 (seed 0, the loader's default)."""
    plan = plan_epoch([s.samples for s in index.shards], seed=0, epoch=0, dp_rank=0, dp_size=1,
                      workers=max(workers, 1), batch_size=batch_size)
    out = []
    for segments in plan:
        shards = [index.shards[seg.shard] for seg in segments]
        out.append([(index.shard_path(s), seg.start * s.bytes // s.samples, seg.end * s.bytes // s.samples)
                    for seg, s in zip(segments, shards)])
    return out


def read_ranges(ranges: list[Range], ahead: bool) -> None:
    """Read the ranges in 8 MiB reads, with sequential-access advice; with ``ahead``, also asking the kernel to read
    ahead as the loader does (tarshard's READ_AHEAD past the read, HINT_STEP at a time)."""
    for path, start, end in ranges:
        with open(path, "rb", buffering=0) as fh:
            os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
            fh.seek(start)
            at = hinted = start
            while at < end:
                if ahead and at + BLOCK + READ_AHEAD > hinted:
                    ask = at + BLOCK + READ_AHEAD + HINT_STEP
                    os.posix_fadvise(fh.fileno(), hinted, ask - hinted, os.POSIX_FADV_WILLNEED)
                    hinted = ask
                if not (block := fh.read(min(BLOCK, end - at))):
                    break
                at += len(block)


def raw_read(streams: list[list[Range]], ahead: bool = False) -> None:
    """One forked process per stream, as the DataLoader starts its workers."""
    procs = [multiprocessing.get_context("fork").Process(target=read_ranges, args=(ranges, ahead))
             for ranges in streams]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0, f"raw read stream exited {p.exitcode}"


class Phases(NamedTuple):
    """A loader's epoch: seconds to its first round of batches (one per worker: the workers start together), from
    it to the last batch, after the last to the loop's end (workers stopping); and the bytes of the batches after
    the first round."""

    start: float
    steady: float
    stop: float
    steady_bytes: int


def one_epoch(loader: ShardLoader) -> Phases:
    begin = time.perf_counter()
    first = last = 0.0
    first_bytes = taken = 0
    for _ in loader:
        last, taken = time.perf_counter(), taken + 1
        if taken == max(loader.workers, 1):
            first, first_bytes = last, loader.stats.bytes
    end = time.perf_counter()
    return Phases(first - begin, last - first, end - last, loader.stats.bytes - first_bytes)


class Cost(NamedTuple):
    """A case's wall time, its phases (a loader's), and the CPU time and page faults of this process and its
    (joined) child processes."""

    seconds: float
    phases: Phases | None
    user: float
    sys: float
    faults: int

    def rate(self, total: int) -> float:
        """Bytes per second: a loader's from its first round of batches to its last batch, a raw read's from start
        to end."""
        return self.phases.steady_bytes / self.phases.steady if self.phases else total / self.seconds


def timed(run: Callable[[], Phases | None]) -> Cost:
    def usage() -> list[float]:
        both = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return [sum(u.ru_utime for u in both), sum(u.ru_stime for u in both), sum(u.ru_minflt for u in both)]

    before, start = usage(), time.perf_counter()
    phases = run()
    seconds = time.perf_counter() - start
    user, sys, faults = (b - a for a, b in zip(before, usage()))
    return Cost(seconds, phases, user, sys, int(faults))


def state_after(index: ShardIndex, kw: dict[str, Any], batches: int) -> dict[str, Any]:
    loader = ShardLoader(index, **kw)
    for _ in itertools.islice(loader, batches):
        pass
    return loader.state_dict()


def first_batch_after_resume(index: ShardIndex, kw: dict[str, Any], state: dict[str, Any]) -> float:
    start = time.perf_counter()
    fresh = ShardLoader(index, **kw)
    fresh.load_state_dict(state)
    next(iter(fresh))
    return time.perf_counter() - start


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=4.0)
    ap.add_argument("--dir", type=Path, default=Path("/var/tmp/hpctrain-bench-data"))
    ap.add_argument("--sample-kb", type=int, default=1024)
    ap.add_argument("--shard-mb", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--shuffle-buffer", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    index = dataset(args.dir, int(args.size_gb * 1e9), args.sample_kb << 10, args.shard_mb << 20)
    total = sum(s.bytes for s in index.shards)
    streams = worker_ranges(index, args.workers, args.batch_size)
    raw = f"raw read, {len(streams)} streams"
    print(f"{len(index.shards)} shards, {index.total_samples} samples, {total / 1e9:.2f} GB in {args.dir}; "
          f"workers={args.workers} batch={args.batch_size} shuffle_buffer={args.shuffle_buffer}; "
          f"{args.repeats} repeats; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    kw = dict(batch_size=args.batch_size, workers=args.workers, shuffle_buffer=args.shuffle_buffer)
    for cache in ("cold", "warm"):
        cold = cache == "cold"
        runs: dict[str, Callable[[], Phases | None]] = {
            raw: lambda: raw_read(streams, ahead=cold),  # readahead asked for where it helps, as the loader does
            "loader, undecoded": lambda: one_epoch(ShardLoader(index, decode=False, **kw)),
            "loader, reused buffers": lambda: one_epoch(ShardLoader(index, decode=False, reuse_buffers=True, **kw)),
            "loader, .npy decoded": lambda: one_epoch(ShardLoader(index, **kw)),
        }
        names = list(runs)
        costs: dict[str, list[Cost]] = {name: [] for name in names}
        raw_read(streams)  # warms the cache for the warm pass; the cold pass drops it before each case
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                if cold:
                    drop_cache(index)
                costs[name].append(timed(runs[name]))
        print(f"{cache} cache: MB/s (a loader's from its first round of batches to its last batch), median "
              f"(min-max) of {args.repeats}; x {raw}, of the medians (per repeat min-max); a loader's whole epoch x "
              "the raw read's, and its workers' start (to the first round) and stop; CPU s (user, sys) and page faults "
              "per MB, medians, all processes")
        ratio, epoch = {}, {}
        for name in names:
            rates, raw_rates = [c.rate(total) for c in costs[name]], [c.rate(total) for c in costs[raw]]
            per_repeat = [a / b for a, b in zip(rates, raw_rates)]
            ratio[name] = statistics.median(rates) / statistics.median(raw_rates)
            epoch[name] = (statistics.median(c.seconds for c in costs[raw])
                           / statistics.median(c.seconds for c in costs[name]))
            user, sys, faults = (statistics.median(getattr(c, k) for c in costs[name]) for k in Cost._fields[2:])
            ends = ""
            if name != raw:
                start, stop = (statistics.median(getattr(c.phases, k) for c in costs[name]) * 1e3
                               for k in ("start", "stop"))
                ends = f"epoch {epoch[name]:4.2f} x, start {start:3.0f} ms, stop {stop:3.0f} ms  "
            print(f"  {name:22} {spread([r / 1e6 for r in rates], '6.0f')}  {ratio[name]:5.2f} x "
                  f"({min(per_repeat):.2f}-{max(per_repeat):.2f})  {ends}CPU {user:4.2f} + {sys:4.2f} s  "
                  f"{faults / (total / 1e6):5.0f} faults/MB")
        for name in ("loader, undecoded", "loader, reused buffers"):
            short = name.removeprefix("loader, ")
            figure(f"{short} loader / {raw}, {cache} cache", ratio[name], "x",
                   f">= {GOAL} x raw, {len(streams)} streams", ratio[name] >= GOAL)
            figure(f"{short} loader, whole epoch / {raw}, {cache} cache", epoch[name], "x",
                   "shown: with the workers' start and stop, once per epoch")

    per_epoch = len(ShardLoader(index, **kw))
    print(f"resume: seconds from load_state_dict to the first batch, median (min-max) of {args.repeats}, "
          "by batches already consumed")
    medians = []
    for fraction in (0.0, 0.25, 0.5, 0.75, 0.95):
        batches = int(fraction * per_epoch)
        state = state_after(index, kw, batches)
        times = [first_batch_after_resume(index, kw, state) for _ in range(args.repeats)]
        medians.append(statistics.median(times))
        print(f"  {batches:6d} of {per_epoch} batches: {spread(times, '6.3f')} s  {medians[-1] / medians[0]:5.2f} x "
              "at the start")
    figure("resume at 95 % of an epoch / at its start", medians[-1] / medians[0], "x", "flat (< 2 x)",
           medians[-1] / medians[0] < 2)


if __name__ == "__main__":
    main()
