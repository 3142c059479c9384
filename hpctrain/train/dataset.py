"""The reference trainer's token data as WebDataset shards, and batches from the shard loader.

Each sample is one sequence of seq_len + 1 int64 tokens stored as .npy (the same sequences as
`hpctrain.train.synthetic`); a micro-batch's inputs are the first seq_len tokens, its labels the
last seq_len.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import torch

from hpctrain.config.job import Model
from hpctrain.data.index import ShardIndex
from hpctrain.data.packing import pack
from hpctrain.train.synthetic import Batch, samples


def token_samples(model: Model, seed: int, count: int) -> Iterator[dict[str, Any]]:
    for i in range(count):
        ids, labels = samples(model, seed, i, 1)
        yield {"__key__": f"{i:09d}", "npy": torch.cat([ids[0], labels[0, -1:]]).numpy()}


def pack_token_dataset(out_dir: str | Path, model: Model, seed: int, count: int, shard_bytes: int) -> ShardIndex:
    """Write ``count`` token sequences as shards plus their index."""
    return pack(token_samples(model, seed, count), out_dir, shard_bytes=shard_bytes)


def loader_batches(loader: Any) -> Generator[Batch, None, None]:
    """Endless (input_ids, labels) micro-batches from a ShardLoader, epoch after epoch."""
    while True:
        for batch in loader:
            tokens = torch.as_tensor(batch["npy"], dtype=torch.int64)
            yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
