"""Shared pieces of the checkpoint tests: bit patterns, damage, and the child processes (crash writer, ranks).

Run as a module for the crash writer, with tests/ on PYTHONPATH (``start_crash_writer`` does):
``python -m helpers.checkpoint crash-writer DIR [WORLD ROWS [SAVES]]``.
It imports numpy and tensorstore only (no torch), so that each of the many children starts fast.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

from helpers.paths import tests_on_path

# Bit patterns every float dtype must keep: NaNs with payloads, ±inf, -0, subnormals, extremes.
_SPECIAL_BITS = {
    "float32": [0x7FC00001, 0xFFC00000, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F7FFFFF],
    "bfloat16": [0x7FC1, 0xFFC0, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x807F, 0x7F7F],
    "float16": [0x7E01, 0xFE00, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x83FF, 0x7BFF],
}


def special_array(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    """Random bits of ``dtype`` (so NaNs, subnormals, ... turn up) with the special patterns in front."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(bool).reshape(shape)
    if dtype == "int64":
        a = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64, endpoint=True)
        a[:3] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1][: n]
        return a.reshape(shape)
    real = np.dtype(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else dtype)
    bits = np.dtype(f"uint{8 * real.itemsize}")
    a = rng.integers(0, np.iinfo(bits).max, n, dtype=bits, endpoint=True)
    special = _SPECIAL_BITS[dtype][:n]
    a[: len(special)] = special
    return a.view(real).reshape(shape)


def same_bits(a: object, b: object) -> bool:
    """Bitwise equality of two tensors or arrays (NaN payloads, -0 included), shape and dtype too."""
    x, y = _np(a), _np(b)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def _np(a: object) -> np.ndarray:
    from hpctrain.checkpoint.format import as_numpy

    return np.ascontiguousarray(as_numpy(a))


def chunk_file(ckpt: Path, name: str, index: tuple[int, ...] = (0,)) -> Path:
    return ckpt / "tensors" / name / "c" / "/".join(map(str, index))


def flip_byte(path: Path, at: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def ranks_save(directory: Path, states: list[dict], step: int = 1, **kw: object) -> list[Path | None]:
    """Save ``states[r]`` as rank r of len(states), each rank on its own thread; returns each rank's result."""
    from concurrent.futures import ThreadPoolExecutor

    from hpctrain.checkpoint import Checkpointer

    world = len(states)
    cks = [Checkpointer(directory, rank=r, world_size=world, attempt="a1", journal=None, **kw) for r in range(world)]
    with ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(lambda r: cks[r].save(step, states[r]).result(), r) for r in range(world)]
        try:
            return [f.result() for f in futures]
        finally:
            for ck in cks:
                ck.close()


def crash_state(step: int, rank: int = 0, world: int = 1, rows: int = 64) -> dict:
    """Rank ``rank``'s state in the crash tests at ``step``, its content telling the step: ``w`` and ``m``
    split into row shards of ``rows`` rows across the ``world`` ranks, ``b`` replicated (rank 0 writes it).
    About ``rows`` KiB per rank."""
    from hpctrain.checkpoint import Shard

    first = rank * rows
    w = np.arange(first * 192, (first + rows) * 192, dtype=np.float32).reshape(rows, 192) + step
    m = np.arange(first * 32, (first + rows) * 32, dtype=np.int64).reshape(rows, 32) * step
    return {
        "model": {"w": Shard(w, (world * rows, 192), (first, 0)),
                  "b": (np.arange(8 * rows, dtype=np.uint16) + step).view(ml_dtypes.bfloat16)},
        "optim": {"m": Shard(m, (world * rows, 32), (first, 0)), "flag": np.array(step % 2 == 0)},
        "step": step,
    }


def check_checkpoint(path: Path, step: int, world: int = 1, rows: int = 64) -> None:
    """Assert that ``path`` verifies and every rank's saved tree is that rank's ``crash_state(step)``."""
    from hpctrain.checkpoint import load, verify

    assert verify(path).step == step
    for rank in range(world):
        assert leaves_equal(load(path, rank=rank, to="numpy"), _unsharded(crash_state(step, rank, world, rows))), \
            f"{path}: rank {rank}'s state differs from step {step}'s"


def _unsharded(state: dict) -> dict:
    """``state`` with each Shard replaced by its data: a rank's tree as ``load`` returns it."""
    from hpctrain.checkpoint import Shard

    if isinstance(state, dict):
        return {k: _unsharded(v) for k, v in state.items()}
    return state.data if isinstance(state, Shard) else state


def start_crash_writer(directory: Path, world: int = 1, rows: int = 64,
                       saves: int | None = None) -> subprocess.Popen[str]:
    """A crash writer process (see ``crash_writer``), returned once it has resumed and is about to save."""
    args = [str(a) for a in (world, rows, *([saves] if saves is not None else []))]
    child = subprocess.Popen([sys.executable, "-m", "helpers.checkpoint", "crash-writer", str(directory), *args],
                             env=tests_on_path(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if child.stdout.readline() != "ready\n":
        child.kill()
        raise AssertionError(f"crash writer failed to resume:\n{child.communicate()[1]}")
    return child


def crash_writer(directory: str, world: int = 1, rows: int = 64, saves: int | None = None) -> None:
    """``world`` ranks (threads of this process) resume from the newest checkpoint, checking it, say 'ready',
    then save step after step (odd steps async), ``saves`` times (then say 'saved') or until killed."""
    import threading
    import uuid
    from concurrent.futures import ThreadPoolExecutor

    from hpctrain.checkpoint import Checkpointer, Retention
    from hpctrain.ledger.journal import Journal

    attempt = uuid.uuid4().hex[:12]
    cks = [Checkpointer(directory, rank=r, world_size=world, attempt=attempt, retention=Retention(keep_last=2),
                        journal=Journal(Path(directory) / "journal"), commit_timeout_s=60) for r in range(world)]
    restored = cks[0].load_latest(to="numpy")
    if restored is None:
        start = 0
        with ThreadPoolExecutor(world) as pool:
            list(pool.map(lambda r: cks[r].save(0, crash_state(0, r, world, rows)).result(), range(world)))
    else:
        start = restored.step
        check_checkpoint(restored.path, start, world, rows)
    print("ready", flush=True)
    lockstep = threading.Barrier(world)  # as training's collectives keep real ranks together

    def run(rank: int) -> None:
        step = start
        while saves is None or step < start + saves:
            step += 1
            cks[rank].save(step, crash_state(step, rank, world, rows), async_=step % 2 == 1)
            lockstep.wait()
        cks[rank].close()

    with ThreadPoolExecutor(world) as pool:
        list(pool.map(run, range(world)))
    print("saved", flush=True)


def global_tensors(step: int) -> dict[str, np.ndarray]:
    """The full tensors of the 4-rank test at ``step``."""
    return {"col": special_array("float32", (8, 6), step), "row": special_array("bfloat16", (6, 8), step),
            "norm": special_array("float16", (5,), step), "mask": special_array("bool", (7,), step),
            "flat": special_array("int64", (10,), step), "count": np.array(step, np.int64)}


def rank_state(rank: int, step: int, *, zeros: bool = False) -> dict:
    """Rank ``rank``'s state in a tp=2 x dp=2 layout: tensor-parallel row and column slices written by the
    dp=0 replicas, replicated tensors (written by rank 0), a ZeRO-style flat partition on every rank
    (uneven: 3+3+3+1), plus a value that differs per rank."""
    import torch

    from hpctrain.checkpoint import Shard
    from hpctrain.checkpoint.format import to_torch

    g = global_tensors(step)
    tp, dp = rank % 2, rank // 2

    def t(a: np.ndarray) -> torch.Tensor:
        tensor = to_torch(np.ascontiguousarray(a))
        return torch.zeros_like(tensor) if zeros else tensor

    return {
        "model": {"col": Shard(t(g["col"][tp * 4:tp * 4 + 4]), (8, 6), (tp * 4, 0), write=dp == 0),
                  "row": Shard(t(g["row"][:, tp * 4:tp * 4 + 4]), (6, 8), (0, tp * 4), write=dp == 0),
                  "norm": t(g["norm"]), "mask": t(g["mask"]), "count": t(g["count"])},
        "optim": {"flat": Shard(t(g["flat"][3 * rank:3 * rank + 3]), (10,), (3 * rank,), chunks=(3,)),
                  "lr": 0.1 * step},
        "note": f"rank {rank}",
    }


def leaves_equal(a: dict, b: dict) -> bool:
    """Bitwise equality of two rank states (tensors, Shard data and values)."""
    from hpctrain.checkpoint import Shard
    from hpctrain.checkpoint.tree import flatten

    la, lb = flatten(a)[0], flatten(b)[0]
    data = lambda x: x.data if isinstance(x, Shard) else x  # noqa: E731
    return la.keys() == lb.keys() and all(
        same_bits(data(la[k]), data(lb[k])) if not isinstance(la[k], (int, float, str)) else la[k] == lb[k]
        for k in la)


def rank_main(rank: int, world: int, directory: str, init_file: str) -> None:
    """One of the 4 spawned ranks: two saves (async, then sync) with training collectives running on the
    main thread meanwhile, then resume into zeroed tensors of the same layout, as saved, and into a full
    tensor."""
    import torch
    import torch.distributed as dist

    from hpctrain.checkpoint import Checkpointer, Retention, load

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ck = Checkpointer(directory, rank=rank, world_size=world, layout={"tp": 2, "dp": 2},
                      retention=Retention(keep_last=1), commit_timeout_s=120)
    for step in (1, 2):
        ck.save(step, rank_state(rank, step), cursor={"rank": rank, "step": step}, async_=step == 1)
        for _ in range(10):  # the same number of collectives on every rank, whatever the save is doing
            dist.all_reduce(torch.ones(4))
        ck.wait()
    dist.barrier()  # the committing rank has committed step 2
    restored = ck.load_latest(like=rank_state(rank, 0, zeros=True))
    assert restored is not None and restored.step == 2, restored
    assert restored.cursor == {"rank": rank, "step": 2} and restored.rng is not None
    assert leaves_equal(restored.state, rank_state(rank, 2)), f"rank {rank}: state differs after load"
    assert leaves_equal(load(restored.path, rank=rank), rank_state(rank, 2)), f"rank {rank}: own tree differs"
    full = load(restored.path, {"model": {"col": torch.zeros(8, 6)}}, rank=rank)["model"]["col"]
    assert same_bits(full, global_tensors(2)["col"]), f"rank {rank}: full tensor differs"
    ck.close()
    dist.destroy_process_group()


if __name__ == "__main__" and sys.argv[1] == "crash-writer":
    crash_writer(sys.argv[2], *map(int, sys.argv[3:]))
