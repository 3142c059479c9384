"""Four spawned ranks (torch.distributed, gloo on CPU) save a tp=2 x dp=2 sharded state and resume from it."""

import multiprocessing as mp

import zarr

from hpctrain.checkpoint import latest_valid, load_flat
from hpctrain.checkpoint.manifest import Manifest
from hpctrain.checkpoint.naming import list_dirs

from helpers.checkpoint import global_tensors, rank_main, same_bits

WORLD = 4


def test_four_ranks_write_their_own_shards_and_resume_bit_exact(tmp_path):
    ctx = mp.get_context("spawn")  # never fork: tensorstore aborts in a forked child
    procs = [ctx.Process(target=rank_main, args=(r, WORLD, str(tmp_path / "ck"), str(tmp_path / "pg")))
             for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0] * WORLD, "a rank failed: see its traceback above"

    path = latest_valid(tmp_path / "ck", full=True)
    assert [d.path for d in list_dirs(tmp_path / "ck", kind=None)] == [path]  # step 1 went to retention
    full = load_flat(path)
    for name, expected in global_tensors(2).items():
        group = "optim" if name == "flat" else "model"
        assert same_bits(full[f"{group}/{name}"], expected), name
    m = Manifest.read(path)
    writers = {n: sorted({c.rank for c in e.chunks.values()}) for n, e in m.tensors.items()}
    assert writers == {"model/col": [0, 1], "model/row": [0, 1], "model/norm": [0], "model/mask": [0],
                       "model/count": [0], "optim/flat": [0, 1, 2, 3]}
    assert m.tensors["model/row"].meta.chunks == (6, 4) and m.tensors["optim/flat"].meta.chunks == (3,)
    assert m.data["layout"] == {"tp": 2, "dp": 2} and sorted(m.ranks) == [0, 1, 2, 3]
    assert [m.ranks[r]["cursor"] for r in range(WORLD)] == [{"rank": r, "step": 2} for r in range(WORLD)]
    assert len({m.ranks[r]["pid"] for r in range(WORLD)}) == WORLD
    for name in m.tensors:
        assert zarr.open_array(path / "tensors" / name, mode="r").shape == m.tensors[name].meta.shape
