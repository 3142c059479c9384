"""Per-rank compute time: three spawned ranks (gloo on CPU) of one stage, the third slow in its forward pass."""

import multiprocessing as mp
import os
from types import SimpleNamespace

from hpctrain.jobs.stragglers import stragglers
from hpctrain.ledger.journal import Journal


def rank_main(rank: int, init_file: str, journal: str) -> None:
    import time

    import torch
    import torch.distributed as dist

    from hpctrain.runtime.stragglers import ComputeTimer

    os.environ.update(HPCTRAIN_JOURNAL_DIR=journal, HPCTRAIN_JOB_ID="1", SLURMD_NODENAME=f"n{rank}")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=3)

    class Part(torch.nn.Module):
        def forward(self, x):
            # 30 times as slow: the ratio stays over 2 with up to 0.28 s of scheduling delay on each call (a busy
            # machine's), where 3 times as slow fell to 1.8 (CI with the lanes beside).
            time.sleep(0.3 if rank == 2 else 0.01)
            return x * 2

    part = Part()
    timer = ComputeTimer(part, stage=0, every=5)
    for step in range(1, 11):
        part(torch.ones(2))
        dist.all_reduce(torch.ones(1))  # the others wait here for the slow one
        timer(None, SimpleNamespace(step=step))
    dist.destroy_process_group()


def test_the_slow_rank_is_the_straggler_and_the_ranks_waiting_for_it_are_not(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, str(tmp_path / "pg"), str(tmp_path / "journal"))) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    records = [r for _, r in Journal(tmp_path / "journal").records(kinds=["ranks"])]
    assert [r["step"] for r in records] == [5, 10]
    for record in records:
        assert [(r["rank"], r["node"]) for r in record["ranks"]] == [(0, "n0"), (1, "n1"), (2, "n2")]
        (slow,) = stragglers(record["ranks"])
        assert (slow.rank, slow.node) == (2, "n2") and slow.ratio > 2


def test_a_rank_that_was_fast_or_slowed_for_a_moment_flags_no_other():
    """Against the stage's median, not its fastest: a lucky fast rank, or one slowed by a busy machine's
    scheduling, leaves the ranks doing as well as the rest unflagged (as in CI, 0.011 s against 0.02 s)."""
    def ranks(*compute):
        return [{"rank": r, "node": f"n{r}", "stage": 0, "compute_s": c} for r, c in enumerate(compute)]

    assert [(s.rank, round(s.ratio, 1)) for s in stragglers(ranks(0.011, 0.02, 0.3))] == [(2, 15.0)]
    assert stragglers(ranks(0.005, 0.01, 0.01, 0.011)) == []
    assert [s.rank for s in stragglers(ranks(0.1, 0.2))] == [1]  # of two, the faster is the low median
