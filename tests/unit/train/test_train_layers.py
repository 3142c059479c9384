"""Tensor-parallel layers: a tp=2 model (two spawned gloo ranks) equals the unsplit one, forward and backward."""

import multiprocessing as mp

from helpers.train import layers_rank_main

WORLD = 2


def test_tp_split_gpt_matches_unsplit_forward_and_gradients(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=layers_rank_main, args=(r, WORLD, str(tmp_path / "rendezvous"))) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * WORLD, "a rank failed: see its traceback above"
