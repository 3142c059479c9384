"""Checking shards against their index: size, tar structure, sample count, sha256."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.data.tarshard import Shard, ShardCorrupt


def verify_index(index: ShardIndex, *, jobs: int = 4) -> list[str]:
    """One line per bad shard, naming its first problem; empty when every shard matches the index."""
    with ThreadPoolExecutor(jobs) as pool:  # hashing and reads release the GIL: parallel reads help on Lustre
        problems = pool.map(lambda shard: _problem(index, shard), index.shards)
        return [f"{index.shard_path(s)}: {p}" for s, p in zip(index.shards, problems) if p]


def _problem(index: ShardIndex, shard: ShardInfo) -> str | None:
    try:
        with Shard(index, shard) as opened:  # checks the size
            count = opened.count()
    except ShardCorrupt as exc:
        return str(exc)
    if count != shard.samples:
        return f"{count} samples, index says {shard.samples}"
    hashed = hashlib.sha256()
    with open(index.shard_path(shard), "rb") as fh:
        while block := fh.read(1 << 20):
            hashed.update(block)
    digest = hashed.hexdigest()
    return None if digest == shard.sha256 else f"sha256 {digest}, index says {shard.sha256}"
