"""Checkpoint I/O against the disk's ceiling: hpctrain vs fio vs torch.save/torch.load, same bytes, same disk.

    .venv/bin/python benchmarks/checkpoint_io.py [--size-mb 1024] [--tensors 16] [--repeats 5] [--dir DIR]

The ceiling is fio's (apt-get install fio; without it those cases are skipped), run in the same temp dir and
the same repeats: sequential write, fsynced at the end (--end_fsync=1), and sequential read, each with direct
I/O and buffered, at hpctrain's parallelism and block sizes as imported from its writer and reader
(_WRITE_STREAMS jobs writing _WRITE_BLOCK at a time; _READ_STREAMS jobs reading a whole chunk file at a
time), the bytes in files of hpctrain's chunk-file size, fresh for every write (--fallocate=none). fio's
own runtime is its time (its start-up and file set-up left out; it includes the final fsync). Goals:
hpctrain's save and load >= 0.9 x the faster of fio's direct and buffered runs, >= 1 x torch.save and
torch.load. Also timed: hpctrain with its own chunk-file writes and reads turned off (every chunk through
tensorstore, as chunks that are not contiguous runs of a tensor go), which is the reason to keep them
only if it is slower; and one Python thread writing one file (streamed as hpctrain's writer does) and
reading it, to show what the streams add.

Every write is durable (fsynced) before the clock stops. Each repeat times each format's write and then
its reads, the formats in an order rotated from repeat to repeat and reversed every other repeat, so that
every write follows reads, every read its own write, and no format always the same other one (on a
virtual disk, writes right after other writes ran up to 3x slower, pauses between cases made everything
slower, and, before hpctrain's reader advised sequential access as fio does (its fadvise_hint, which
doubles the readahead window), hpctrain's loads ran at 0.94-1.02 x fio's buffered reads in a session of
only those two formats, at 0.67-0.71 x with fio's direct I/O cases added). Page cache: dropping it needs root, so before each read
the files' cached pages are evicted with posix_fadvise(DONTNEED) (after fsync they are clean, so the
kernel drops them); reads then come from the device, or whatever caches sit below a virtual disk. Every
case starts on recently used memory (``recycle_memory``). hpctrain load: into new tensors (``load(path)``,
as a fresh process resumes) and in place (into the caller's tensors, ``load(path, like)``).

Retention is out of the timed windows: the Checkpointers keep every checkpoint, and after each save,
before the next case, the benchmark applies Retention(keep_last=1) itself and times it apart: the previous
checkpoint taken out of sight (hpctrain does this at commit, on the saving thread) and deleted, the deletion
made durable (hpctrain deletes on a background thread, which overlapped the next case).

Async stall, as a fraction of a sync save: the time training is blocked by save(async_=True,
copy="background") in a simulated training step (``training_step``: the copy runs during forward and
backward, ``--step-s``; wait_snapshot() before the optimizer step), the figure held against the goal; and,
for comparison, how long save(async_=True) blocks with copy="now", for the 2nd and later saves of a
Checkpointer (host buffers reused) and its first (buffers allocated).

Figures: each case's median over the repeats and its spread (min-max); each ratio of rates is the ratio of
the medians, its spread that of the ratios within each repeat (both of its cases ran in that repeat). CPU s: user and
system time of the process (of fio's jobs while they ran, for fio), which on a machine with few cores can
bound a case. Parts of hpctrain's saves and loads are timed by wrapping its functions (a few clock reads
per call): wall time in write_pieces, of it the directory fsyncs; in the fragment and commit; from the
first chunk file's write or read to the last one's end; CPU time of the CRC32C. With them and the CPU
times, a missed goal is printed with its measured cause. Other load on the machine, and a
virtual disk's throttling, slow cases down at random (the load average is shown).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, TypeVar
from unittest import mock

import numpy as np
import torch

from _figures import figure
from hpctrain.checkpoint import Checkpointer, Retention, checkpointer, load, reader, writer
from hpctrain.checkpoint.commit import remove
from hpctrain.checkpoint.naming import list_dirs
from hpctrain.checkpoint.retention import apply_retention
from hpctrain.checkpoint.tree import flatten
from hpctrain.files import fsync_dir

T = TypeVar("T")
KEEP_ALL = Retention(keep_last=2**62)  # the benchmark applies retention itself, outside the timed window


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


def cpu_seconds() -> float:
    """User and system time of this process so far, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rotated(cases: dict[str, T], by: int) -> list[tuple[str, T]]:
    """The cases in order, starting at number ``by`` (modulo their number)."""
    items = list(cases.items())
    by %= len(items)
    return items[by:] + items[:by]


def raw_write(path: Path, arrays: list[np.ndarray]) -> None:
    """One thread writing the arrays into one file as hpctrain's writer streams: writeback started, and
    written pages dropped, block by block."""
    with open(path, "wb", buffering=0) as fh:
        done = 0
        for a in arrays:
            view = memoryview(a).cast("B")
            for i in range(0, len(view), writer._WRITE_BLOCK):
                done += fh.write(view[i:i + writer._WRITE_BLOCK])
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


class Measured(NamedTuple):
    """What a case that times itself (fio) measured."""

    seconds: float
    cpu_seconds: float


def fio(directory: Path, rw: str, direct: bool, nbytes: int, chunk: int) -> Measured:
    """fio moving ``nbytes`` as hpctrain does (see the module's doc), into or out of ``directory``: its runtime
    and its jobs' CPU time meanwhile, scaled to ``nbytes`` should fio move a few bytes fewer (shares rounded
    to its blocks)."""
    streams, block = (writer._WRITE_STREAMS, writer._WRITE_BLOCK) if rw == "write" else (reader._READ_STREAMS, chunk)
    share = nbytes // streams
    directory.mkdir(exist_ok=True)
    proc = subprocess.run(
        ["fio", "--name=ckpt", f"--directory={directory}", f"--rw={rw}", f"--direct={int(direct)}",
         f"--numjobs={streams}", f"--bs={block}", f"--size={share}", f"--filesize={chunk}",
         f"--nrfiles={-(-share // chunk)}", "--file_service_type=sequential", "--fallocate=none",
         "--ioengine=psync", "--group_reporting", "--output-format=json", *(["--end_fsync=1"] * (rw == "write"))],
        check=False, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"fio {rw} (direct={int(direct)}) failed: {proc.stderr.strip() or proc.stdout[-500:]}")
    job = json.loads(proc.stdout)["jobs"][0]  # the group's: job_runtime sums its jobs', their CPU a % of it
    scale = nbytes / job[rw]["io_bytes"]
    return Measured(job[rw]["runtime"] / 1000 * scale,
                    (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1000 * scale)


# name, files whose cached pages to evict, what to time: what a case returns as Measured replaces the
# clock's time and the process's CPU time.
Case = tuple[str, Path | None, Callable[[], object]]


class Parts:
    """Time spent in some of hpctrain's checkpoint functions, wrapped to be timed (a few clock reads a call)."""

    def __init__(self, stack: ExitStack) -> None:
        self.stack = stack
        self.now: dict[str, float] = defaultdict(float)
        self.spans: dict[str, tuple[float, float]] = {}
        self.taken: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        self.lock = threading.Lock()

    def wrap(self, module: Any, name: str, part: str, clock: Callable[[], float] = time.perf_counter,
             span: bool = False) -> None:
        """Time the calls of ``module.name`` as ``part``: summed (by ``clock``: ``time.thread_time`` for the
        CPU time of calls on several threads), or with ``span``, from the first one's start to the last one's end."""
        fn = getattr(module, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                end = clock()
                with self.lock:
                    if span:
                        first, last = self.spans.get(part, (start, end))
                        self.spans[part] = min(first, start), max(last, end)
                    else:
                        self.now[part] += end - start

        self.stack.enter_context(mock.patch.object(module, name, wrapped))

    def case(self, name: str, files: Path | None, fn: Callable[[], object]) -> Case:
        """A case timing ``fn``, the parts it spends recorded under ``name``."""
        def run() -> object:
            self.now.clear()
            self.spans.clear()
            result = fn()
            for part, seconds in [*self.now.items(), *((p, last - first) for p, (first, last) in self.spans.items())]:
                self.taken[name][part].append(seconds)
            return result
        return name, files, run


def sync_save(ck: Checkpointer, steps: Iterator[int], state: dict[str, torch.Tensor]) -> Path | None:
    return ck.save(next(steps), state).result()


def load_newest(directory: Path, like: dict[str, torch.Tensor] | None = None) -> Any:
    """hpctrain's load of the newest checkpoint in ``directory`` (the one just saved: steps rise in the order
    the cases run)."""
    return load(list_dirs(directory)[-1].path, like)


def via_tensorstore(fn: Callable[[], T]) -> Callable[[], T]:
    """``fn`` with hpctrain's own chunk-file writes and reads turned off: tensorstore does all the I/O."""
    def run() -> T:
        with mock.patch.object(writer, "contiguous_chunks", return_value=False), \
                mock.patch.object(reader, "contiguous_chunks", return_value=False):
            return fn()
    return run


def prune(directory: Path, t: dict[str, list[float]]) -> None:
    """Retention with keep_last=1, as hpctrain applies it after a commit, timed into ``t`` if it finds a
    checkpoint to delete: the previous one taken out of sight, then deleted and the deletion made durable."""
    start = time.perf_counter()
    if apply_retention(directory, Retention(keep_last=1), "bench", None):
        t["retention: to trash"].append(time.perf_counter() - start)
        t["retention: delete"].append(timed(lambda: (remove([d.path for d in list_dirs(directory, kind="trash")]),
                                                     fsync_dir(directory))))


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


def time_groups(groups: dict[str, list[Case]], repeat: int, t: dict[str, list[float]],
                before: Callable[[], object], cpu: dict[str, list[float]] | None = None) -> None:
    """Time every case into ``t`` (and its CPU time into ``cpu``), the groups in an order rotated by
    ``repeat`` and reversed when it is odd (so that no group always follows the same one), ``before`` run
    before each."""
    order = rotated(groups, repeat)
    for _, cases in order[::-1] if repeat % 2 else order:
        for name, files, fn in cases:
            if files is not None:
                evict(files)
            before()
            cpu_start, start = cpu_seconds(), time.perf_counter()
            result = fn()
            seconds, cpu_used = time.perf_counter() - start, cpu_seconds() - cpu_start
            if isinstance(result, Measured):
                seconds, cpu_used = result
            t[name].append(seconds)
            if cpu is not None:
                cpu[name].append(cpu_used)
            del result  # what a load returned is freed here, outside every timed window


def time_table(t: dict[str, list[float]], rated: tuple[str, ...], nbytes: int,
               cpu: dict[str, list[float]] | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Print the median time, its rate, the spread of rates and the median CPU time of the ``rated`` cases;
    returns the median and best time of every case."""
    med = {k: statistics.median(v) for k, v in t.items() if v}
    best = {k: min(v) for k, v in t.items() if v}
    print(f"{'case':40} {'median s':>8} {'GB/s':>6} {'GB/s min-max':>13}" + (f" {'CPU s':>6}" if cpu else ""))
    for k in (k for k in rated if k in med):
        spread = f"{nbytes / max(t[k]) / 1e9:.2f}-{nbytes / best[k] / 1e9:.2f}"
        print(f"{k:40} {med[k]:8.3f} {nbytes / med[k] / 1e9:6.2f} {spread:>13}"
              + (f" {statistics.median(cpu[k]):6.2f}" if cpu else ""))
    return med, best


def spread(values: list[float], fmt: str = ".3f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def cause(case: str, other: str, t: dict[str, list[float]], cpu: dict[str, list[float]],
          parts: dict[str, list[float]]) -> list[str]:
    """What was measured of ``case`` and ``other`` that tells where ``case`` loses: CPU use, and the parts of
    ``case``'s time (``parts``, per run, as ``Parts`` took them)."""
    median = statistics.median

    def busy(k: str) -> str:
        return (f"{median(t[k]):.3f} s, {median(cpu[k]):.2f} CPU s "
                f"({median(cpu[k]) / median(t[k]):.1f} of {os.cpu_count()} cores busy)")

    lines = [f"{case}: {busy(case)}; {other}: {busy(other)}"]
    if "write_pieces" in parts:
        pieces, fsyncs, commit = (median(parts[k]) for k in ("write_pieces", "directory fsyncs", "fragment + commit"))
        writes = median(parts["chunk writes"]) if "chunk writes" in parts else 0.0
        rest = median([a - b - c for a, b, c in zip(t[case], parts["write_pieces"], parts["fragment + commit"])])
        lines.append(f"{case}: chunk files written, checksummed and fsynced by hpctrain (first write's start to last "
                     f"one's end) {writes:.3f} s, the rest of write_pieces (by tensorstore, zarr metadata) "
                     f"{pieces - writes - fsyncs:.3f} s, directory fsyncs {fsyncs:.3f} s, fragment and commit "
                     f"{commit:.3f} s, the rest (flatten, plan, snapshot, RNG state) {rest:.3f} s")
    if "chunk reads" in parts:
        reads = median(parts["chunk reads"])
        lines.append(f"{case}: chunk files read and checksummed (first read's start to last one's end) {reads:.3f} s, "
                     f"the rest (manifest, checks, allocation, assembly) "
                     f"{median([a - b for a, b in zip(t[case], parts['chunk reads'])]):.3f} s")
    lines.append(f"{case}: CRC32C {median(parts['crc32c CPU']):.3f} CPU s, spread over its threads")
    in_place = "hpctrain load (in place)"
    if case == "hpctrain load":
        lines.append(f"{in_place}, the same reads into the caller's tensors: {busy(in_place)}; new tensors - in "
                     f"place: {median(t[case]) - median(t[in_place]):+.3f} s, "
                     f"{median(cpu[case]) - median(cpu[in_place]):+.2f} CPU s")
    if other.startswith("fio read"):
        lines.append("fio reads all of a job's blocks into one buffer, allocated once")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=1024, help="state size in MiB (default 1024)")
    parser.add_argument("--tensors", type=int, default=16, help="number of fp32 tensors (default 16)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-s", type=float, default=0.5,
                        help="forward+backward time of the simulated training step (default 0.5 s)")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to write (a temp dir is made inside)")
    args = parser.parse_args()
    have_fio = shutil.which("fio") is not None
    if not have_fio:
        print("fio not found (apt-get install fio, or scripts/install): the disk-ceiling cases and goals are skipped")

    per = (args.size_mb << 20) // args.tensors // 4
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 2**32, per, dtype=np.uint32).view(np.float32) for _ in range(args.tensors)]
    state = {f"layer{i}": torch.from_numpy(a) for i, a in enumerate(arrays)}
    nbytes = sum(a.nbytes for a in arrays)
    chunk = max(p.meta.chunk_file_bytes for p in writer.plan(flatten(state)[0], writes_replicated=True))
    work = Path(tempfile.mkdtemp(prefix="hpctrain-bench-", dir=args.dir))
    t: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    load_before = os.getloadavg()[0]
    raw, pt = work / "raw.bin", work / "state.pt"
    fio_dirs = {"direct": work / "fio-direct", "buffered": work / "fio-buffered"} if have_fio else {}
    fio_groups: dict[str, list[Case]] = {
        f"fio {kind}": [(f"fio {rw}, {kind}", d if rw == "read" else None,
                         partial(fio, d, rw, kind == "direct", nbytes, chunk)) for rw in ("write", "read")]
        for kind, d in fio_dirs.items()}
    try:
        with ExitStack() as stack:
            parts = Parts(stack)
            parts.wrap(checkpointer, "write_pieces", "write_pieces")
            parts.wrap(writer, "_fsync_tree", "directory fsyncs")
            parts.wrap(writer, "_write_chunk", "chunk writes", span=True)
            parts.wrap(reader, "_read_chunk", "chunk reads", span=True)
            parts.wrap(checkpointer, "write_fragment", "fragment + commit")
            parts.wrap(checkpointer, "commit", "fragment + commit")
            for module in (writer, reader):
                parts.wrap(module, "checksum", "crc32c CPU", time.thread_time)
            ck = stack.enter_context(Checkpointer(work / "ck", retention=KEEP_ALL, journal=None))
            like = {k: v.clone() for k, v in state.items()}
            steps = itertools.count(1)
            groups: dict[str, list[Case]] = {  # each format's write, then its reads
                "raw": [("raw write, 1 stream", None, lambda: raw_write(raw, arrays)),
                        ("raw read, 1 stream", raw, lambda: raw_read(raw, arrays))],
                "torch": [("torch.save", None, lambda: torch_save(pt, state)),
                          ("torch.load", pt, lambda: torch.load(pt, weights_only=True))],
                "hpctrain": [parts.case("hpctrain save", None, partial(sync_save, ck, steps, state)),
                             parts.case("hpctrain load", ck.directory, partial(load_newest, ck.directory)),
                             parts.case("hpctrain load (in place)", ck.directory,
                                        partial(load_newest, ck.directory, like))],
                "tensorstore": [parts.case("hpctrain save, via tensorstore", None,
                                           via_tensorstore(partial(sync_save, ck, steps, state))),
                                parts.case("hpctrain load, via tensorstore", ck.directory,
                                           via_tensorstore(partial(load_newest, ck.directory)))],
                **fio_groups}
            for repeat in range(args.repeats):
                time_groups(groups, repeat, t, cpu=cpu,
                            before=lambda: (prune(ck.directory, t), recycle_memory(2 * nbytes)))
                raw.unlink()
                pt.unlink()
                for d in fio_dirs.values():
                    shutil.rmtree(d)
                fsync_dir(work)

                with Checkpointer(ck.directory, retention=KEEP_ALL, journal=None) as saver:
                    for i in range(3):  # the first async save of a Checkpointer allocates its host buffers
                        start = time.perf_counter()
                        saver.save(next(steps), state, async_=True)
                        stall = time.perf_counter() - start
                        saver.wait()
                        t["async save total"].append(time.perf_counter() - start)
                        t["async stall" if i else "async stall (first)"].append(stall)
                        prune(ck.directory, t)
                    for _ in range(3):
                        t["async stall (background copy)"].append(
                            training_step(saver, next(steps), state, args.step_s))
                        saver.wait()
                        prune(ck.directory, t)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"state: {args.tensors} fp32 tensors, {nbytes / 2**20:.0f} MiB in chunk files of {chunk >> 20} MiB; "
          f"{args.repeats} repeats; dir {args.dir}; {os.cpu_count()} cores; "
          f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"hpctrain: writes with {writer._WRITE_STREAMS} streams, {writer._WRITE_BLOCK >> 20} MiB at a time; reads "
          f"with {reader._READ_STREAMS} streams, a chunk file at a time; fio the same (ioengine psync)")
    med, _ = time_table(t, ("raw write, 1 stream", "fio write, direct", "fio write, buffered", "torch.save",
                            "hpctrain save", "hpctrain save, via tensorstore",
                            "raw read, 1 stream", "fio read, direct", "fio read, buffered", "torch.load",
                            "hpctrain load", "hpctrain load (in place)", "hpctrain load, via tensorstore"), nbytes, cpu)
    for k, label in (("retention: to trash", "retention: to trash (in a save)"),
                     ("retention: delete", "retention: delete (in background)"),
                     ("async stall (first)", "async stall, first save"),
                     ("async stall", "async stall, 2nd and later saves"),
                     ("async stall (background copy)", "async stall, copy in background"),
                     ("async save total", "async save, call to committed")):
        print(f"{label:40} {spread(t[k])} s")
    print("parts of a save or load, median s (min-max):")
    for case, taken in parts.taken.items():
        print(f"  {case}: " + "; ".join(f"{part} {spread(v)}" for part, v in taken.items()))

    ratios: list[tuple[str, str, float | None, str]] = [  # case, baseline, goal (x the baseline's rate), its name
        ("hpctrain save", "torch.save", 1.0, "torch.save"), ("hpctrain load", "torch.load", 1.0, "torch.load"),
        ("hpctrain save", "hpctrain save, via tensorstore", 1.0, "tensorstore"),
        ("hpctrain load", "hpctrain load, via tensorstore", 1.0, "tensorstore"),
        ("hpctrain save", "raw write, 1 stream", None, ""), ("hpctrain load", "raw read, 1 stream", None, "")]
    if have_fio:
        best_fio = {rw: min(fio_dirs, key=lambda kind: med[f"fio {rw}, {kind}"]) for rw in ("write", "read")}
        ratios[:0] = [("hpctrain save", f"fio write, {best_fio['write']}", 0.9, "best fio"),
                      ("hpctrain load", f"fio read, {best_fio['read']}", 0.9, "best fio"),
                      ("hpctrain load (in place)", f"fio read, {best_fio['read']}", 0.9, "best fio")]
    print(f"{'rate ratio':54} {'medians (repeats)':17}   goal")
    missed = []
    for case, other, goal, goal_name in ratios:
        per_repeat = [b / a for a, b in zip(t[case], t[other])]
        ratio = med[other] / med[case]
        goal_text = f">= {goal:g} x {goal_name}" if goal else ""
        label = f"{case.removeprefix('hpctrain ')} / {other.removeprefix('hpctrain ')}"
        value = f"{ratio:5.2f} ({min(per_repeat):.2f}-{max(per_repeat):.2f})"
        print(f"{label:54} {value:17}   {goal_text}".rstrip())
        if goal:
            figure(f"hpctrain {label}, {nbytes >> 20} MiB", ratio, "x", goal_text, ratio >= goal)
            if ratio < goal:
                missed.append((case, other))
    for case, other in missed:
        print(f"below goal, {case} vs {other}, measured (medians):")
        for line in cause(case, other, t, cpu, parts.taken[case]):
            print(f"  {line}")

    print(f"{'async stall / sync save':40} {'median':>8} {'fastest':>8}")
    for k, label, goal_text in (("async stall (background copy)", f"copy overlapping a {args.step_s} s step", "<= 5%"),
                                ("async stall", "copy before save returns", ""),
                                ("async stall (first)", "first save", "")):
        print(f"{label:40} {100 * med[k] / med['hpctrain save']:7.1f}% "
              f"{100 * med[k] / min(t['hpctrain save']):7.1f}%   {goal_text}".rstrip())
    stall = 100 * med["async stall (background copy)"] / med["hpctrain save"]
    figure(f"async save: training blocked / sync save (median; {args.step_s} s steps)", stall, "%", "<= 5 %",
           stall <= 5)


if __name__ == "__main__":
    main()
