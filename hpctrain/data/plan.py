"""Which samples each data-parallel rank and DataLoader worker reads in an epoch, and in which order.

Everything here is a pure function of the index's sample counts and (seed, epoch, dp_rank, dp_size,
workers, batch_size, shuffle_buffer), so tensor- and pipeline-parallel peers of one DP rank, which
build their loaders independently, read identical samples in identical order.

The split is by sample range, not whole shards: the epoch's shard order is one seeded permutation,
its samples laid end to end, and each DP rank takes an equal contiguous range of floor(N / dp_size)
samples. DP ranks therefore run the same number of steps whatever the shard count or shard sizes;
the N % dp_size (< dp_size) samples at the end of the epoch's order are left out of that epoch (the
shard order, so which samples, changes every epoch). A shard cut by a range boundary is read in part
by two readers; seeking to its first sample costs only tar headers (see tarshard).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from webdataset.filters import shuffle


@dataclass(frozen=True)
class Segment:
    """Samples [start, end) of shard number ``shard`` of the index."""

    shard: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


# Per worker: (segment number in its plan, samples of that segment already consumed).
# (len(plan), 0) means the worker has finished the epoch.
Position = tuple[int, int]


def shard_order(n_shards: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n_shards))
    random.Random(f"shards/{seed}/{epoch}").shuffle(order)
    return order


def worker_lengths(samples: int, workers: int, batch_size: int) -> list[int]:
    """Samples per worker: whole batches dealt round-robin, the partial one to the next worker in turn.

    The DataLoader takes one batch from each worker in turn, so only the epoch's last batch is short.
    """
    full, rest = divmod(samples, batch_size)
    per, extra = divmod(full, workers)
    lengths = [(per + (w < extra)) * batch_size for w in range(workers)]
    lengths[extra] += rest  # extra < workers
    return lengths


def plan_epoch(
    counts: Sequence[int], *, seed: int, epoch: int, dp_rank: int, dp_size: int, workers: int, batch_size: int
) -> list[list[Segment]]:
    """The segments each worker of ``dp_rank`` reads in ``epoch``, in reading order (``workers`` >= 1)."""
    order = shard_order(len(counts), seed, epoch)
    per_rank = sum(counts) // dp_size
    plan, lo = [], dp_rank * per_rank
    for length in worker_lengths(per_rank, workers, batch_size):
        plan.append(_segments(order, counts, lo, lo + length))
        lo += length
    return plan


def _segments(order: Sequence[int], counts: Sequence[int], lo: int, hi: int) -> list[Segment]:
    """Samples [lo, hi) of the epoch's concatenation of shards, as per-shard segments."""
    out, pos = [], 0
    for shard in order:
        a, b = max(lo, pos), min(hi, pos + counts[shard])
        if a < b:
            out.append(Segment(shard, a - pos, b - pos))
        pos += counts[shard]
    return out


def segment_order(segment: Segment, *, seed: int, epoch: int, shuffle_buffer: int) -> list[int]:
    """Shard-local sample numbers in the order they are served: webdataset's shuffle buffer, seeded."""
    samples = iter(range(segment.start, segment.end))
    if shuffle_buffer <= 1:
        return list(samples)
    rng = random.Random(f"samples/{seed}/{epoch}/{segment.shard}/{segment.start}")
    return list(shuffle(shuffle_buffer, initial=shuffle_buffer, rng=rng)(samples))


def consumed(plan: Sequence[Segment], position: Position) -> int:
    """Samples of the worker's epoch already consumed at ``position``."""
    seg, offset = position
    return sum(s.length for s in plan[:seg]) + offset


def position_after(plan: Sequence[Segment], samples: int) -> Position:
    """The position once ``samples`` of the worker's epoch are consumed (normalised past finished segments)."""
    for i, segment in enumerate(plan):
        if samples < segment.length:
            return i, samples
        samples -= segment.length
    return len(plan), 0
