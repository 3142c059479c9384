"""Checkpoint I/O: hpctrain vs torch.save/torch.load vs raw sequential write+fsync/read, same bytes, same disk.

    .venv/bin/python benchmarks/checkpoint_io.py [--size-mb 1024] [--tensors 16] [--repeats 3] [--dir DIR]

Every write is durable (fsynced) before the clock stops. Page cache: dropping it needs root, so
before each read the files' cached pages are evicted with posix_fadvise(DONTNEED) (after fsync they
are clean, so the kernel drops them); reads then come from the device, or whatever caches sit below
a virtual disk. Async stall: how long save(async_=True) blocks the caller, in steady state (host
buffers reused from the previous save) and the first time (buffers allocated), against a sync save.
Figures are medians over the repeats; other load on the machine skews them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from hpctrain.checkpoint import Checkpointer, Retention, load
from hpctrain.ledger.journal import fsync_dir


def evict(root: Path) -> None:
    """Drop the page-cache pages of every file under ``root`` (or of file ``root``)."""
    for path in [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def raw_write(path: Path, arrays: list[np.ndarray]) -> None:
    with open(path, "wb", buffering=0) as fh:
        for a in arrays:
            fh.write(memoryview(a).cast("B"))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="state size in MiB (default 1024)")
    parser.add_argument("--tensors", type=int, default=16, help="number of fp32 tensors (default 16)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to write (a temp dir is made inside)")
    args = parser.parse_args()

    per = (args.size_mb << 20) // args.tensors // 4
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 2**32, per, dtype=np.uint32).view(np.float32) for _ in range(args.tensors)]
    state = {f"layer{i}": torch.from_numpy(a) for i, a in enumerate(arrays)}
    nbytes = sum(a.nbytes for a in arrays)
    work = Path(tempfile.mkdtemp(prefix="hpctrain-bench-", dir=args.dir))
    t: dict[str, list[float]] = {k: [] for k in ("raw write", "raw read", "torch.save", "torch.load",
                                                 "hpctrain save", "hpctrain load", "hpctrain load (in place)",
                                                 "async stall (first)", "async stall", "async save total")}
    try:
        ck = Checkpointer(work / "ck", retention=Retention(keep_last=1), journal=None)
        like = {k: torch.empty_like(v) for k, v in state.items()}
        step = 0
        for _ in range(args.repeats):
            raw = work / "raw.bin"
            t["raw write"].append(timed(lambda: raw_write(raw, arrays)))
            evict(raw)
            t["raw read"].append(timed(lambda: raw_read(raw, arrays)))
            raw.unlink()

            pt = work / "state.pt"
            t["torch.save"].append(timed(lambda: torch_save(pt, state)))
            evict(pt)
            t["torch.load"].append(timed(lambda: torch.load(pt, weights_only=True)))
            pt.unlink()

            step += 1
            t["hpctrain save"].append(timed(lambda: ck.save(step, state).result()))
            path = ck.directory / f"step_{step:08d}"
            evict(path)
            t["hpctrain load"].append(timed(lambda: load(path)))
            evict(path)
            t["hpctrain load (in place)"].append(timed(lambda: load(path, like)))

            for _ in range(2):  # the first async save of a Checkpointer allocates its host buffers
                step += 1
                start = time.perf_counter()
                ck.save(step, state, async_=True)
                stall = time.perf_counter() - start
                ck.wait()
                t["async save total"].append(time.perf_counter() - start)
                t["async stall" if t["async stall (first)"] else "async stall (first)"].append(stall)
        ck.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in t.items()}
    gbs = lambda k: nbytes / med[k] / 1e9  # noqa: E731
    print(f"state: {args.tensors} fp32 tensors, {nbytes / 2**20:.0f} MiB; {args.repeats} repeats, medians; "
          f"dir {args.dir}")
    print(f"{'case':28} {'seconds':>8} {'GB/s':>7}")
    for k in ("raw write", "torch.save", "hpctrain save", "raw read", "torch.load", "hpctrain load",
              "hpctrain load (in place)"):
        print(f"{k:28} {med[k]:8.3f} {gbs(k):7.2f}")
    print(f"{'async stall (first save)':28} {med['async stall (first)']:8.3f}")
    print(f"{'async stall (steady)':28} {med['async stall']:8.3f}")
    save_raw, save_torch = med["raw write"] / med["hpctrain save"], med["torch.save"] / med["hpctrain save"]
    load_raw, load_torch = med["raw read"] / med["hpctrain load"], med["torch.load"] / med["hpctrain load"]
    stall = med["async stall"] / med["hpctrain save"]
    print(f"save: {save_raw:.2f}x raw, {save_torch:.2f}x torch.save   (goal >= 0.9x raw, >= 1x torch)")
    print(f"load: {load_raw:.2f}x raw, {load_torch:.2f}x torch.load   (goal >= 0.9x raw, >= 1x torch); "
          f"in place {med['raw read'] / med['hpctrain load (in place)']:.2f}x raw")
    print(f"async stall: {100 * stall:.1f}% of a sync save (goal <= 5%); first save "
          f"{100 * med['async stall (first)'] / med['hpctrain save']:.1f}%")


if __name__ == "__main__":
    main()
