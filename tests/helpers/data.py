"""Small datasets and loader runs shared by the data tests; module-level so spawned processes can use them."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from webdataset.writer import numpy_dumps

from hpctrain.data import ShardIndex, ShardLoader, pack


def sample(i: int) -> dict[str, Any]:
    return {"__key__": f"s{i:05d}", "npy": np.full(8, i, dtype=np.int64)}


SAMPLE_BYTES = len(numpy_dumps(sample(0)["npy"]))
# The loader settings of the resume tests (test_data_loader.py, test_data_sources.py).
KW = dict(batch_size=4, workers=2, seed=11, shuffle_buffer=6)  # 25 batches an epoch: workers get 13 and 12


def make_dataset(root: Path, n: int, per_shard: int) -> ShardIndex:
    """``n`` samples, about ``per_shard`` per shard (the last shard shorter)."""
    return pack((sample(i) for i in range(n)), root, shard_bytes=per_shard * SAMPLE_BYTES - 1)


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt one byte of a file in place, keeping its size."""
    content = bytearray(path.read_bytes())
    content[offset] ^= 0xFF
    path.write_bytes(bytes(content))


def batch_keys(batch: dict[str, Any]) -> list[str]:
    """The batch's keys, checked against the decoded arrays so that decoding is exercised too."""
    keys = list(batch["__key__"])
    assert [f"s{int(row[0]):05d}" for row in batch["npy"]] == keys
    return keys


def take(loader: ShardLoader, batches: int | None) -> list[str]:
    """Keys of the next ``batches`` batches (all of the current epoch when None)."""
    out: list[str] = []
    for batch in itertools.islice(loader, batches):
        out += batch_keys(batch)
    return out


def fork_workers() -> None:
    """A spawned process's initializer: its DataLoader workers forked, as a rank's are (a spawned process would spawn
    them too, each a fresh interpreter importing torch: 1.4 CPU-seconds a worker and epoch)."""
    import multiprocessing

    multiprocessing.set_start_method("fork", force=True)


def epoch_keys(index: str, dp_rank: int, dp_size: int, global_rank: int, world_size: int) -> list[str]:
    """One epoch as a rank of a dp x tp job sees it; the global RANK is set to show the loader ignores it."""
    os.environ.update(RANK=str(global_rank), WORLD_SIZE=str(world_size))
    loader = ShardLoader(index, batch_size=4, dp_rank=dp_rank, dp_size=dp_size, workers=2, seed=7, shuffle_buffer=5)
    return take(loader, None)


def resume_and_finish(index: str, state_json: str, batches: int, kwargs_json: str) -> list[str]:
    """In a fresh process: load the state, then take ``batches`` more batches."""
    loader = ShardLoader(index, **json.loads(kwargs_json))
    loader.load_state_dict(json.loads(state_json))
    return take_across_epochs(loader, batches)


def take_across_epochs(loader: ShardLoader, batches: int) -> list[str]:
    """Keys of the next ``batches`` batches, continuing into later epochs."""
    out: list[str] = []
    while batches > 0:
        got = 0
        for batch in itertools.islice(loader, batches):
            out += batch_keys(batch)
            got += 1
        batches -= got
    return out
