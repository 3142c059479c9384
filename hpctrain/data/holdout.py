"""Held-out data: which shards of an index are never trained on, and the fixed samples an evaluation reads.

A held-out share of an index is chosen by the hashes of its shards' names, so the same index gives the same
split whatever the seed, the layout or the order the shards were packed in; a separate held-out index must
share no shard (by content) with the training index. An evaluation reads the first samples of its shards in
index order, the same ones every time.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import Any

from hpctrain.data.index import ShardIndex
from hpctrain.data.tarshard import Shard, ShardCorrupt
from hpctrain.errors import DataError


def split_holdout(index: ShardIndex, share: float) -> tuple[ShardIndex, ShardIndex]:
    """(training shards, held-out shards) of ``index``: ``share`` of its shards, at least one, held out."""
    if not 0 < share < 1:
        raise ValueError(f"share must be between 0 and 1, not {share}")
    count = max(1, math.ceil(share * len(index.shards)))
    if count >= len(index.shards):
        raise DataError(
            f"{index.path}: eval.holdout = {share} of {len(index.shards)} shards leaves none to train on "
            "(pack smaller shards, or give eval.index)"
        )
    ranked = sorted(index.shards, key=lambda s: hashlib.sha256(s.name.encode()).hexdigest())
    held = {s.name for s in ranked[:count]}
    return (
        replace(index, shards=tuple(s for s in index.shards if s.name not in held)),
        replace(index, shards=tuple(s for s in index.shards if s.name in held)),
    )


def check_disjoint(train: ShardIndex, held_out: ShardIndex) -> None:
    """DataError naming the first held-out shard whose content is also a training shard's."""
    trained = {s.sha256: s.name for s in train.shards}
    for shard in held_out.shards:
        if shard.sha256 in trained:
            raise DataError(
                f"{held_out.path}: shard {shard.name} is also in the training index {train.path} "
                f"(as {trained[shard.sha256]}): held-out data must never be trained on"
            )


def first_samples(index: ShardIndex, count: int) -> list[dict[str, Any]]:
    """The first ``count`` samples of ``index`` in index order, decoded (webdataset's default decoder)."""
    from webdataset import autodecode

    if index.total_samples < count:
        raise DataError(
            f"{index.path}: the evaluation needs {count} samples, the held-out shards hold {index.total_samples}"
        )
    decoder = autodecode.Decoder([])
    found: list[dict[str, Any]] = []
    for info in index.shards:
        wanted = range(min(info.samples, count - len(found)))
        try:
            with Shard(index, info) as shard:
                found += [decoder(sample) for _, sample in shard.samples(wanted)]
        except ShardCorrupt as exc:
            raise DataError(f"{index.location(info)}: held-out shard is corrupt: {exc}") from None
        if len(found) == count:
            break
    return found
