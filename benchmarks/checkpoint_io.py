"""Checkpoint I/O: hpctrain vs torch.save/torch.load vs raw sequential write+fsync/read, same bytes, same disk.

    .venv/bin/python benchmarks/checkpoint_io.py [--size-mb 1024] [--tensors 16] [--repeats 5] [--dir DIR]

Every write is durable (fsynced) before the clock stops. Each repeat times each format's write and
then its reads, the formats in an order rotated from repeat to repeat, so that every write follows
reads and every read its own write (on a virtual disk, writes right after other writes ran up to 3x
slower, and pauses between cases made everything slower). Page cache: dropping it needs root, so
before each read the files' cached pages are evicted with posix_fadvise(DONTNEED) (after fsync they
are clean, so the kernel drops them); reads then come from the device, or whatever caches sit below
a virtual disk. Raw write: buffered then fsynced (as dd conv=fsync), and streamed as hpctrain's writer
does (``raw_write_streamed``, the faster here and the one the goal is held against). Every case
starts on recently used memory (``recycle_memory``). hpctrain load: into
new tensors (``load(path)``, as a fresh process resumes) and in place (into the caller's tensors,
``load(path, like)``). Async stall, as a fraction of a sync save: the time training is blocked by
save(async_=True, copy="background") in a simulated training step (``training_step``: the copy runs
during forward and backward, ``--step-s``; wait_snapshot() before the optimizer step), the figure
held against the goal; and, for comparison, how long save(async_=True) blocks with copy="now", for
the 2nd and later saves of a Checkpointer (host buffers reused) and its first (buffers allocated).
Figures: the median and the best of the repeats; other load on the machine, and a virtual disk's
throttling, slow cases down at random (the load average is shown), so the best is the steadier figure.
The stall itself hardly varies: it is held against both the median and the fastest sync save.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np
import torch

from _figures import figure
from hpctrain.checkpoint import Checkpointer, Retention, load
from hpctrain.checkpoint.naming import committed_name
from hpctrain.files import fsync_dir

T = TypeVar("T")


def evict(root: Path) -> None:
    """Drop the page-cache pages of every file under ``root`` (or of file ``root``)."""
    for path in [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def recycle_memory(nbytes: int) -> None:
    """Touch and free ``nbytes`` of memory, so that the next case starts, as every case here does, on
    memory recently in use: on this virtual machine, pages that sat free cost 3-5x more to touch
    (the host backs them again), and which case got those depended on the order of the cases."""
    torch.ones(nbytes, dtype=torch.uint8)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def rotated(cases: dict[str, T], by: int) -> list[tuple[str, T]]:
    """The cases in order, starting at number ``by`` (modulo their number)."""
    items = list(cases.items())
    by %= len(items)
    return items[by:] + items[:by]


def raw_write(path: Path, arrays: list[np.ndarray]) -> None:
    with open(path, "wb", buffering=0) as fh:
        for a in arrays:
            fh.write(memoryview(a).cast("B"))
        os.fsync(fh.fileno())
    fsync_dir(path.parent)


def raw_write_streamed(path: Path, arrays: list[np.ndarray], block: int = 8 << 20) -> None:
    """raw_write as hpctrain's writer streams: writeback started, and written pages dropped, block by block."""
    with open(path, "wb", buffering=0) as fh:
        done = 0
        for a in arrays:
            view = memoryview(a).cast("B")
            for i in range(0, len(view), block):
                done += fh.write(view[i:i + block])
                os.posix_fadvise(fh.fileno(), 0, done, os.POSIX_FADV_DONTNEED)
        os.fsync(fh.fileno())
    fsync_dir(path.parent)


def raw_read(path: Path, arrays: list[np.ndarray]) -> list[np.ndarray]:
    # torch's allocator, like torch.load and hpctrain's load: numpy's huge-page advice makes page faults
    # stall on memory compaction at random on these machines.
    out = [torch.empty(a.shape, dtype=torch.float32).numpy() for a in arrays]
    with open(path, "rb", buffering=0) as fh:
        for o in out:
            fh.readinto(memoryview(o).cast("B"))
    return out


def torch_save(path: Path, state: dict[str, torch.Tensor]) -> None:
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    fsync_dir(path.parent)


def training_step(ck: Checkpointer, step: int, state: dict[str, torch.Tensor], compute_s: float) -> float:
    """A training step that saves the state it starts from with copy="background": forward and backward
    (``compute_s`` of matrix products, not touching the state) run while the state is copied, then the
    optimizer step changes it in place once ``wait_snapshot`` lets it. Returns the time training was blocked."""
    start = time.perf_counter()
    ck.save(step, state, async_=True, copy="background")
    blocked = time.perf_counter() - start
    a = torch.randn(256, 256)
    while time.perf_counter() - start < compute_s:
        a = torch.tanh(a @ a)
    start = time.perf_counter()
    ck.wait_snapshot()
    blocked += time.perf_counter() - start
    with torch.no_grad():
        for t in state.values():
            t.add_(1.0)
    return blocked


Case = tuple[str, Path | None, Callable[[], object]]  # name, files whose cached pages to evict, what to time


def time_groups(groups: dict[str, list[Case]], repeat: int, t: dict[str, list[float]],
                before: Callable[[], object]) -> None:
    """Time every case into ``t``, the groups in an order rotated by ``repeat``, ``before`` run before each."""
    for _, cases in rotated(groups, repeat):
        for name, files, fn in cases:
            if files is not None:
                evict(files)
            before()
            t[name].append(timed(fn))


def time_table(t: dict[str, list[float]], rated: tuple[str, ...], nbytes: int) -> tuple[dict[str, float], dict[str, float]]:
    """Print the median and best time and rate of the ``rated`` cases; returns the median and best of every case."""
    med = {k: statistics.median(v) for k, v in t.items()}
    best = {k: min(v) for k, v in t.items()}
    print(f"{'case':32} {'median s':>8} {'GB/s':>6}   {'best s':>8} {'GB/s':>6}")
    for k in rated:
        print(f"{k:32} {med[k]:8.3f} {nbytes / med[k] / 1e9:6.2f}   {best[k]:8.3f} {nbytes / best[k] / 1e9:6.2f}")
    return med, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="state size in MiB (default 1024)")
    parser.add_argument("--tensors", type=int, default=16, help="number of fp32 tensors (default 16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.5,
                        help="forward+backward time of the simulated training step (default 0.5 s)")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to write (a temp dir is made inside)")
    args = parser.parse_args()

    per = (args.size_mb << 20) // args.tensors // 4
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 2**32, per, dtype=np.uint32).view(np.float32) for _ in range(args.tensors)]
    state = {f"layer{i}": torch.from_numpy(a) for i, a in enumerate(arrays)}
    nbytes = sum(a.nbytes for a in arrays)
    work = Path(tempfile.mkdtemp(prefix="hpctrain-bench-", dir=args.dir))
    t: dict[str, list[float]] = {k: [] for k in ("raw write", "raw write (streamed)", "raw read", "torch.save", "torch.load",
                                                 "hpctrain save", "hpctrain load", "hpctrain load (in place)",
                                                 "async stall (first)", "async stall", "async stall (background copy)",
                                                 "async save total")}
    load_before = os.getloadavg()[0]
    raw, pt = work / "raw.bin", work / "state.pt"
    try:
        ck = Checkpointer(work / "ck", retention=Retention(keep_last=1), journal=None)
        like = {k: torch.empty_like(v) for k, v in state.items()}
        step = 0
        for repeat in range(args.repeats):
            step += 1
            path = ck.directory / committed_name(step)
            groups = {  # each format's write, then its reads
                "raw": [("raw write", None, lambda: raw_write(raw, arrays)),
                        ("raw write (streamed)", None, lambda: raw_write_streamed(raw, arrays)),
                        ("raw read", raw, lambda: raw_read(raw, arrays))],
                "torch": [("torch.save", None, lambda: torch_save(pt, state)),
                          ("torch.load", pt, lambda: torch.load(pt, weights_only=True))],
                "hpctrain": [("hpctrain save", None, lambda: ck.save(step, state).result()),
                             ("hpctrain load", path, lambda: load(path)),
                             ("hpctrain load (in place)", path, lambda: load(path, like))]}
            time_groups(groups, repeat, t, before=lambda: recycle_memory(2 * nbytes))
            raw.unlink()
            pt.unlink()

            with Checkpointer(ck.directory, retention=Retention(keep_last=1), journal=None) as saver:
                for i in range(3):  # the first async save of a Checkpointer allocates its host buffers
                    step += 1
                    start = time.perf_counter()
                    saver.save(step, state, async_=True)
                    stall = time.perf_counter() - start
                    saver.wait()
                    t["async save total"].append(time.perf_counter() - start)
                    t["async stall" if i else "async stall (first)"].append(stall)
                for _ in range(3):
                    step += 1
                    t["async stall (background copy)"].append(training_step(saver, step, state, args.step_s))
                    saver.wait()
        ck.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"state: {args.tensors} fp32 tensors, {nbytes / 2**20:.0f} MiB; {args.repeats} repeats; dir {args.dir}; "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    med, best = time_table(t, ("raw write", "raw write (streamed)", "torch.save", "hpctrain save", "raw read", "torch.load",
                               "hpctrain load", "hpctrain load (in place)"), nbytes)
    for k, label in (("async stall (first)", "async stall, first save"),
                     ("async stall", "async stall, 2nd and later saves"),
                     ("async stall (background copy)", "async stall, copy in background"),
                     ("async save total", "async save, call to committed")):
        print(f"{label:32} {med[k]:8.3f} {'':6}   {best[k]:8.3f}")
    print(f"{'hpctrain rate / other rate':32} {'median':>8} {'best':>8}   goal")
    for case, other, goal in (("hpctrain save", "raw write", ""), ("hpctrain save", "raw write (streamed)", ">= 0.9"),
                              ("hpctrain save", "torch.save", ">= 1"),
                              ("hpctrain load", "raw read", ">= 0.9"), ("hpctrain load", "torch.load", ">= 1"),
                              ("hpctrain load (in place)", "raw read", ""),
                              ("hpctrain load (in place)", "torch.load", "")):
        label = f"{case.removeprefix('hpctrain ')} / {other}"
        ratio = best[other] / best[case]
        print(f"{label:32} {med[other] / med[case]:8.2f} {ratio:8.2f}   {goal}".rstrip())
        if goal:
            figure(f"hpctrain {label} rate, {nbytes >> 20} MiB (best of {args.repeats})", ratio, "x",
                   f"{goal} x", ratio >= float(goal.removeprefix(">= ")))
    print(f"{'async stall / sync save':32} {'median':>8} {'fastest':>8}")
    for k, label, goal in (("async stall (background copy)", f"copy overlapping a {args.step_s} s step", "<= 5%"),
                           ("async stall", "copy before save returns", ""), ("async stall (first)", "first save", "")):
        print(f"{label:32} {100 * med[k] / med['hpctrain save']:7.1f}% {100 * med[k] / best['hpctrain save']:7.1f}%   "
              f"{goal}".rstrip())
    stall = 100 * med["async stall (background copy)"] / med["hpctrain save"]
    figure(f"async save: training blocked / sync save (median; {args.step_s} s steps)", stall, "%", "<= 5 %",
           stall <= 5)


if __name__ == "__main__":
    main()
