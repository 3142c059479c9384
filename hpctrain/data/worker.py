"""What runs inside a DataLoader worker: read, decode and batch one worker's share of an epoch.

Each batch travels with the worker's position after it, so the main process can track what the
training loop consumed rather than what workers prefetched. A shard that turns out corrupt is
abandoned and reported with the next item; the loader decides what to do about it. A shard whose
bytes cannot be had (source's DataError) ends the worker's share with an item saying why, which the
loader raises in the training process as one line (an exception raised in a DataLoader worker would
arrive wrapped in its traceback).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import IterableDataset, get_worker_info
from webdataset import autodecode

from hpctrain.data.index import ShardIndex
from hpctrain.data.plan import Position, Segment, segment_order
from hpctrain.data.tarshard import Shard, ShardCorrupt
from hpctrain.errors import DataError

Sample = dict[str, Any]


@dataclass(frozen=True)
class Quarantined:
    shard: int
    reason: str
    skipped: int


@dataclass(frozen=True)
class Item:
    """A batch (None when a worker only has quarantines or an error to report) and the worker's position
    after it. With ``error``, the shard the worker could not read: the loader stops with it as DataError."""

    worker: int
    position: Position
    batch: Any
    samples: int
    nbytes: int
    quarantined: tuple[Quarantined, ...]
    error: str | None = None


@dataclass(frozen=True)
class EpochJob:
    """Everything a worker needs; pickled into worker processes."""

    index: ShardIndex
    plan: list[list[Segment]]
    starts: list[Position]
    first_worker: int  # the logical worker served by DataLoader worker 0, so round-robin resumes in turn
    seed: int
    epoch: int
    shuffle_buffer: int
    batch_size: int
    decode: bool
    collate: Callable[[list[Sample]], Any]


class EpochDataset(IterableDataset):
    def __init__(self, job: EpochJob):
        self.job = job

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        physical = info.id if info is not None else 0
        return worker_items(self.job, (physical + self.job.first_worker) % len(self.job.plan))


def worker_items(job: EpochJob, worker: int) -> Iterator[Item]:
    segments = job.plan[worker]
    first, skip = job.starts[worker]
    decoder = autodecode.Decoder([]) if job.decode else None
    batch: list[Sample] = []
    nbytes = 0
    bad: list[Quarantined] = []
    for s in range(first, len(segments)):
        segment = segments[s]
        order = segment_order(segment, seed=job.seed, epoch=job.epoch, shuffle_buffer=job.shuffle_buffer)
        done = skip if s == first else 0
        try:
            with Shard(job.index, job.index.shards[segment.shard]) as shard:
                for _, sample in shard.read_in_order(order[done:]):
                    nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
                    batch.append(_decode(decoder, sample) if decoder else sample)
                    done += 1
                    if len(batch) == job.batch_size:
                        position = (s + 1, 0) if done == segment.length else (s, done)
                        yield Item(worker, position, job.collate(batch), len(batch), nbytes, tuple(bad))
                        batch, nbytes, bad = [], 0, []
        except ShardCorrupt as exc:
            bad.append(Quarantined(segment.shard, str(exc), segment.length - done))
        except DataError as exc:
            yield Item(worker, (s, done), None, 0, 0, tuple(bad), str(exc))
            return
    if batch or bad:
        yield Item(worker, (len(segments), 0), job.collate(batch) if batch else None, len(batch), nbytes, tuple(bad))


def _decode(decoder: autodecode.Decoder, sample: Sample) -> Sample:
    try:
        return decoder(sample)
    except Exception as exc:  # decoders raise anything: ValueError, EOFError, UnpicklingError, ...
        raise ShardCorrupt(f"sample {sample['__key__']!r} does not decode: {exc}") from None


def collate_bytes(samples: list[Sample]) -> dict[str, Any]:
    """The default batch of undecoded samples: per field, (data, offsets) with the stored bytes end to end
    in one uint8 tensor, sample i being data[offsets[i]:offsets[i + 1]]. One shared-memory transfer per
    field rather than a pickled list of bytes. Metadata such as "__key__" stays a list."""
    batch: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if key.startswith("__"):
            batch[key] = values
            continue
        ends = list(itertools.accumulate(map(len, values)))
        data = _byte_tensor(ends[-1])
        flat = memoryview(data.numpy())
        for value, start, end in zip(values, [0, *ends], ends):
            flat[start:end] = value
        batch[key] = (data, torch.tensor([0, *ends]))
    return batch


def _byte_tensor(n: int) -> torch.Tensor:
    """An uninitialised uint8 tensor; in a DataLoader worker, in shared memory from the start, as torch's
    default_collate makes its batches: passing it to the training process then copies nothing."""
    if get_worker_info() is None or n == 0:
        return torch.empty(n, dtype=torch.uint8)
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(n))


def as_is(item: Item) -> Item:
    """The DataLoader's collate_fn: items are batched by the worker already."""
    return item
