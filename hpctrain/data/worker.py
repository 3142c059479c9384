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
from functools import partial
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
    after it. With ``error``, the shard the worker could not read: the loader stops with it as DataError.
    With ``slot``, the batch lies in that reused buffer (`Buffers`), to be given back once consumed."""

    worker: int
    position: Position
    batch: Any
    samples: int
    nbytes: int
    quarantined: tuple[Quarantined, ...]
    error: str | None = None
    slot: tuple[int, int] | None = None


class Buffers:
    """Shared-memory batch buffers that each DataLoader worker reuses, rather than a new segment per batch (whose
    first touch, page by page, cost more than reading the bytes). ``free[w, k]`` is 1 while worker w's buffer k
    may be written: the worker clears it as it fills it, the training process sets it once the batch in it has
    been consumed. A worker holds ``count`` of them: those of the batches in flight (the DataLoader's prefetch),
    the one the training loop holds and the one being filled."""

    def __init__(self, workers: int, count: int):
        self.free = torch.ones(workers, count, dtype=torch.uint8).share_memory_()
        self._mine: dict[int, torch.UntypedStorage] = {}  # in a worker: its buffers by number

    def take(self, physical: int, nbytes: int) -> tuple[int | None, torch.UntypedStorage]:
        """A free buffer of worker ``physical`` (its number; None: none was free, a new segment once) of at least
        ``nbytes``, now marked in use. Never waits: a worker that waited would outlive its DataLoader's shutdown,
        since workers ignore SIGTERM."""
        row = self.free[physical]
        k = next((k for k, free in enumerate(row.tolist()) if free), None)  # a copy: the other side writes too
        if k is None:
            return None, torch.UntypedStorage._new_shared(nbytes)
        row[k] = 0
        if (buf := self._mine.get(k)) is None or buf.nbytes() < nbytes:
            buf = self._mine[k] = torch.UntypedStorage._new_shared(nbytes)
        return k, buf

    def give_back(self, slot: tuple[int, int]) -> None:
        self.free[slot] = 1


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
    buffers: Buffers | None = None  # collate_bytes' batches written into reused buffers


class EpochDataset(IterableDataset):
    def __init__(self, job: EpochJob):
        self.job = job

    def __iter__(self) -> Iterator[Item]:
        info = get_worker_info()
        physical = info.id if info is not None else 0
        return worker_items(self.job, (physical + self.job.first_worker) % len(self.job.plan), physical)


def worker_items(job: EpochJob, worker: int, physical: int = 0) -> Iterator[Item]:
    segments = job.plan[worker]
    collate = partial(_collate, job, physical)
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
                        data, slot = collate(batch)
                        yield Item(worker, position, data, len(batch), nbytes, tuple(bad), slot=slot)
                        batch, nbytes, bad = [], 0, []
        except ShardCorrupt as exc:
            bad.append(Quarantined(segment.shard, str(exc), segment.length - done))
        except DataError as exc:
            yield Item(worker, (s, done), None, 0, 0, tuple(bad), str(exc))
            return
    if batch or bad:
        data, slot = collate(batch) if batch else (None, None)
        yield Item(worker, (len(segments), 0), data, len(batch), nbytes, tuple(bad), slot=slot)


def _decode(decoder: autodecode.Decoder, sample: Sample) -> Sample:
    try:
        return decoder(sample)
    except Exception as exc:  # decoders raise anything: ValueError, EOFError, UnpicklingError, ...
        raise ShardCorrupt(f"sample {sample['__key__']!r} does not decode: {exc}") from None


def collate_bytes(samples: list[Sample], alloc: Callable[[int], torch.Tensor] | None = None) -> dict[str, Any]:
    """The default batch of undecoded samples: per field, (data, offsets) with the stored bytes end to end
    in one uint8 tensor, sample i being data[offsets[i]:offsets[i + 1]]. One shared-memory transfer per
    field rather than a pickled list of bytes. Metadata such as "__key__" stays a list. ``alloc(n)``: the
    uninitialised uint8 tensor of n bytes each field's data goes into (default: `_byte_tensor`)."""
    batch: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if key.startswith("__"):
            batch[key] = values
            continue
        ends = list(itertools.accumulate(map(len, values)))
        data = (alloc or _byte_tensor)(ends[-1])
        flat = memoryview(data.numpy())
        for value, start, end in zip(values, [0, *ends], ends):
            flat[start:end] = value
        batch[key] = (data, torch.tensor([0, *ends]))
    return batch


def _collate(job: EpochJob, physical: int, samples: list[Sample]) -> tuple[Any, tuple[int, int] | None]:
    """The batch, and the reused buffer it lies in (with ``job.buffers``: collate_bytes into one of worker
    ``physical``'s, every field's data one after the other in it)."""
    if job.buffers is None:
        return job.collate(samples), None
    nbytes = sum(len(v) for s in samples for k, v in s.items() if not k.startswith("__"))
    k, buf = job.buffers.take(physical, max(nbytes, 1))
    whole = torch.empty(0, dtype=torch.uint8).set_(buf)
    at = 0

    def alloc(n: int) -> torch.Tensor:
        nonlocal at
        at += n
        return whole[at - n:at]

    return collate_bytes(samples, alloc), None if k is None else (physical, k)


def _byte_tensor(n: int) -> torch.Tensor:
    """An uninitialised uint8 tensor; in a DataLoader worker, in shared memory from the start, as torch's
    default_collate makes its batches: passing it to the training process then copies nothing."""
    if get_worker_info() is None or n == 0:
        return torch.empty(n, dtype=torch.uint8)
    return torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(n))


def as_is(item: Item) -> Item:
    """The DataLoader's collate_fn: items are batched by the worker already."""
    return item
