"""The memory tier's resume: two spawned ranks (gloo on CPU), each on a "node" of its own with its own
checkpoint directory, settle on the newest step both have and both load."""

import multiprocessing as mp

from helpers.checkpoint import chunk_file, flip_byte

STEPS = {0: (5, 10, 15), 1: (5, 10)}  # node 1 went down before committing step 15


def node_main(rank: int, directory: str, init_file: str, queue) -> None:
    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import Checkpointer
    from hpctrain.checkpoint.memory import load_agreed

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    with Checkpointer(directory, journal=None) as ck:
        for step in STEPS[rank]:
            ck.save(step, {"w": torch.full((4,), float(step))}, cursor={"step": step})
    dist.barrier()
    results = []
    for newer_than in (-1, 10):
        like = {"w": torch.zeros(4)}
        restored = load_agreed(ck.directory, like, rank=0, newer_than=newer_than)
        results.append(restored and (restored.step, restored.cursor, like["w"].tolist()))
    dist.barrier()
    if rank == 1:  # a corrupt chunk on one node only: both fall back together
        flip_byte(chunk_file(ck.directory / "step_00000010", "w"))
    dist.barrier()
    restored = load_agreed(ck.directory, {"w": torch.zeros(4)}, rank=0)
    results.append(restored.step)
    queue.put((rank, results))
    dist.destroy_process_group()


def test_ranks_agree_on_the_newest_step_every_node_has(tmp_path):
    ctx = mp.get_context("spawn")  # never fork: tensorstore aborts in a forked child
    queue = ctx.Queue()
    procs = [ctx.Process(target=node_main, args=(r, str(tmp_path / f"node{r}"), str(tmp_path / "pg"), queue))
             for r in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert results[0] == results[1] == [(10, {"step": 10}, [10.0] * 4), None, 5]
