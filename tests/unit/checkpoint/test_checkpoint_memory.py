"""A resumed run's memory stays level over many saves, sync and async (issue: one state shard kept per save).

Spawned ranks (gloo on CPU) save, resume with ``load_latest(like=...)`` and then save 10 times sync and
10 times async with each copy mode, from fresh tensors each time as the reference trainer does. Python's cyclic garbage
collector is off in the ranks, as training loops often keep it (they collect every N steps, or never, to
avoid pauses): a save that leaves its state in a reference cycle then keeps one shard per save, every
time, instead of only when the cycle happens to reach the collector's oldest generation.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
from pathlib import Path

WORLD = 2
ROWS, COLS, TENSORS = 1024, 2048, 4  # fp32: 8 MiB per tensor, a 32 MiB shard per rank
SHARD_BYTES = ROWS * COLS * 4 * TENSORS
SAVES = 10


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        kib = next(line for line in status if line.startswith("VmRSS:")).split()[1]
    return int(kib) * 1024


def _state(rank: int, step: int) -> dict:
    """Rank ``rank``'s state at ``step`` in new tensors: row shards of TENSORS matrices, a replicated bias."""
    import torch

    from hpctrain.checkpoint import Shard

    shape, offset = (WORLD * ROWS, COLS), (rank * ROWS, 0)
    return {"model": {f"w{i}": Shard(torch.full((ROWS, COLS), float(step + i)), shape, offset)
                      for i in range(TENSORS)},
            "bias": torch.full((16,), float(step)), "step": step}


def _rank(rank: int, directory: str, init_file: str, out: mp.Queue) -> None:
    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import Checkpointer, Retention

    gc.disable()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    retention = Retention(keep_last=2)
    with Checkpointer(directory, rank=rank, world_size=WORLD, retention=retention, journal=None) as ck:
        ck.save(0, _state(rank, 0))
    dist.barrier()  # step 0 is committed
    ck = Checkpointer(directory, rank=rank, world_size=WORLD, retention=retention, journal=None)
    rss = {"resume": [_rss_bytes()]}
    restored = ck.load_latest(like=_state(rank, -1))
    assert restored is not None and restored.state["model"]["w1"].data[0, 0].item() == 1.0
    del restored
    rss["resume"].append(_rss_bytes())
    step = 0
    for mode, async_, copy in (("sync", False, "now"), ("async", True, "none"), ("async background", True, "background")):
        for n in range(SAVES):
            step += 1
            ck.save(step, _state(rank, step), async_=async_, copy=copy)
            ck.wait()
            if n in (0, SAVES - 1):
                rss.setdefault(mode, []).append(_rss_bytes())
    ck.close()
    out.put((rank, rss))
    dist.destroy_process_group()


def test_a_resumed_run_keeps_no_state_per_save(tmp_path: Path, monkeypatch):
    # glibc's dynamic mmap threshold would keep some freed 8 MiB tensors in the heap (RSS noise of a shard
    # or more); with a fixed one every tensor of 1 MiB or more is its own mapping, and RSS is live memory
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(1 << 20))
    ctx = mp.get_context("spawn")  # never fork: tensorstore aborts in a forked child
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path / "ck"), str(tmp_path / "pg"), out))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * WORLD, "a rank failed: see its traceback above"
    growth = {(rank, what): last - first for rank, rss in results.items() for what, (first, last) in rss.items()}
    shown = ", ".join(f"rank {r} {what} {g / SHARD_BYTES:+.2f}" for (r, what), g in sorted(growth.items()))
    # a state kept per save grows by SAVES - 1 shards; one kept at resume by one shard
    assert all(g < SHARD_BYTES / 2 for g in growth.values()), \
        f"RSS growth over the resume and from the first to the last of {SAVES} saves, in shards of " \
        f"{SHARD_BYTES >> 20} MiB: {shown}"
