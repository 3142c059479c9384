"""What runs inside a DataLoader worker: read, decode and batch one worker's share of an epoch.

Each batch travels with the worker's position after it, so the main process can track what the
training loop consumed rather than what workers prefetched. A shard that turns out corrupt is
abandoned and reported with the next item; the loader decides what to do about it. A shard whose
bytes cannot be had (source's DataError) ends the worker's share with an item saying why, which the
loader raises in the training process as one line (an exception raised in a DataLoader worker would
arrive wrapped in its traceback).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info
from webdataset import autodecode

from hpctrain.data.cache import CacheCounts, ShardCache
from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.data.plan import Position, Segment, segment_order
from hpctrain.data.prefetch import Prefetcher
from hpctrain.data.tarshard import Member, Shard, ShardCorrupt
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
    With ``slot``, the batch is `Packed` in that reused buffer (`Buffers`), to be given back once consumed."""

    worker: int
    position: Position
    batch: Any
    samples: int
    nbytes: int
    quarantined: tuple[Quarantined, ...]
    error: str | None = None
    slot: tuple[int, int] | None = None
    cache: CacheCounts | None = None  # what the worker's reads of the node's cache did since its last item
    cache_fallback: str | None = None  # why it last read a shard from its source instead


@dataclass(frozen=True)
class Packed:
    """A batch of `collate_bytes`'s form that lies in a reused buffer, as sent to the training process: the buffer's
    storage the first time it carries a batch (the training process keeps it), and per field its samples' end
    offsets (byte fields, one after the other in the buffer) or values (metadata, "__key__")."""

    storage: torch.UntypedStorage | None
    fields: dict[str, list[Any]]


class Buffers:
    """Shared-memory batch buffers that each DataLoader worker reuses, rather than a new segment per batch (whose
    first touch, page by page, cost more than reading the bytes). ``free[w, k]`` is 1 while worker w's buffer k
    may be written: the worker clears it as it fills it, the training process sets it once the batch in it has
    been consumed. A worker holds ``count`` of them: those of the batches in flight (the DataLoader's prefetch,
    the one being filled among them) and the one the training loop holds. A buffer's storage travels to the
    training process once, with its first batch (`Packed`): passing a storage's file descriptor costs a connection
    to the worker per tensor, more than reading a batch of megabytes from the page cache."""

    def __init__(self, workers: int, count: int):
        self.free = torch.ones(workers, count, dtype=torch.uint8).share_memory_()
        self._mine: dict[int, torch.UntypedStorage] = {}  # in a worker: its buffers by number
        self._received: dict[tuple[int, int], torch.Tensor] = {}  # in the training process: each buffer, whole

    def take(self, physical: int, nbytes: int) -> tuple[int | None, torch.UntypedStorage, bool]:
        """A free buffer of worker ``physical`` (its number; None: none was free, a new segment once) of at least
        ``nbytes``, now marked in use, and whether its storage is new. Never waits: a worker that waited would
        outlive its DataLoader's shutdown, since workers ignore SIGTERM."""
        row = self.free.numpy()[physical]  # numpy's indexing: a tenth of torch's time
        k = next((k for k, free in enumerate(row.tolist()) if free), None)  # a copy: the other side writes too
        if k is None:
            return None, torch.UntypedStorage._new_shared(nbytes), True
        row[k] = 0
        if fresh := (buf := self._mine.get(k)) is None or buf.nbytes() < nbytes:
            buf = self._mine[k] = torch.UntypedStorage._new_shared(nbytes)
        return k, buf, fresh

    def unpack(self, slot: tuple[int, int], packed: Packed) -> dict[str, Any]:
        """In the training process: the batch ``packed`` describes, in buffer ``slot``."""
        if packed.storage is not None:
            self._received[slot] = _whole(packed.storage)
        return _unpack(self._received[slot], packed.fields)

    def give_back(self, slot: tuple[int, int]) -> None:
        self.free.numpy()[slot] = 1


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
    cache: ShardCache | None = None  # shards read through the node's cache


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
    located = not job.decode and job.collate is collate_bytes  # read the batch's bytes straight into it
    batch: list[Sample] = []
    nbytes = 0
    bad: list[Quarantined] = []
    ahead = _prefetcher(job, [job.index.shards[seg.shard] for seg in segments[first:]])
    try:
        for s in range(first, len(segments)):
            segment = segments[s]
            order = segment_order(segment, seed=job.seed, epoch=job.epoch, shuffle_buffer=job.shuffle_buffer)
            done = skip if s == first else 0
            info = job.index.shards[segment.shard]
            if ahead is not None:
                ahead.reading(s - first)
            try:
                with _located(job, info) as where, Shard(job.index, info, where) as shard:
                    try:
                        for _, sample in shard.read_in_order(order[done:], located):
                            nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
                            batch.append(_decode(decoder, sample) if decoder else sample)
                            done += 1
                            if len(batch) == job.batch_size:
                                position = (s + 1, 0) if done == segment.length else (s, done)
                                data, slot = collate(batch)
                                item = Item(
                                    worker,
                                    position,
                                    data,
                                    len(batch),
                                    nbytes,
                                    tuple(bad),
                                    slot=slot,
                                    **_cache_report(job, ahead),
                                )
                                batch, nbytes, bad = [], 0, []  # before the yield, where the generator may be closed
                                yield item
                    finally:  # what the batch still has in this shard is read before the shard closes
                        batch = [_read_fields(sample) for sample in batch]
            except ShardCorrupt as exc:
                bad.append(Quarantined(segment.shard, str(exc), segment.length - done))
            except DataError as exc:
                yield Item(worker, (s, done), None, 0, 0, tuple(bad), str(exc), **_cache_report(job, ahead))
                return
        if batch or bad or job.cache is not None:
            data, slot = collate(batch) if batch else (None, None)
            yield Item(
                worker, (len(segments), 0), data, len(batch), nbytes, tuple(bad), slot=slot, **_cache_report(job, ahead)
            )
    finally:
        if ahead is not None:
            ahead.stop()


def _located(job: EpochJob, info: ShardInfo) -> contextlib.AbstractContextManager[str | None]:
    """Where to read a shard: a copy in the node's cache (`ShardCache.location`), or (None) its own location."""
    return job.cache.location(job.index, info) if job.cache is not None else contextlib.nullcontext()


def _prefetcher(job: EpochJob, order: list[ShardInfo]) -> Prefetcher | None:
    """The thread that fetches the worker's next shards into the node's cache, where it has one that prefetches."""
    if job.cache is None or not job.cache.prefetch_bytes or len(order) < 2:
        return None
    ahead = job.cache.prefetch_bytes
    if job.cache.max_bytes is not None:  # a small cache: what is fetched ahead must not evict what is read next
        ahead = min(ahead, job.cache.max_bytes // 4)
    return Prefetcher(job.cache, job.index, order, ahead)


def _cache_report(job: EpochJob, ahead: Prefetcher | None) -> dict[str, Any]:
    """An item's account of the cache since the worker's last item, its prefetches' too (nothing without a cache)."""
    if job.cache is None:
        return {}
    counts = job.cache.counts.taken()
    if ahead is not None:
        counts.add(ahead.taken())
    return {"cache": counts, "cache_fallback": job.cache.fallback}


def _read_fields(sample: Sample) -> Sample:
    """``sample`` with each located field (`Member`) read."""
    return {k: v.read() if isinstance(v, Member) else v for k, v in sample.items()}


def _decode(decoder: autodecode.Decoder, sample: Sample) -> Sample:
    try:
        return decoder(sample)
    except Exception as exc:  # decoders raise anything: ValueError, EOFError, UnpicklingError, ...
        raise ShardCorrupt(f"sample {sample['__key__']!r} does not decode: {exc}") from None


def collate_bytes(samples: list[Sample]) -> dict[str, Any]:
    """The default batch of undecoded samples: per field, (data, offsets) with the stored bytes end to end
    in a uint8 tensor, sample i being data[offsets[i]:offsets[i + 1]]; every field's data one after the other
    in one storage: one shared-memory transfer per batch rather than a pickled list of bytes. Metadata such as
    "__key__" stays a list. A field given as a `Member` (the loader's, from a local shard) is read from the
    shard straight into the batch."""
    fields = _layout(samples)
    whole = _byte_tensor(_size(fields))
    _fill(whole, samples, fields)
    return _unpack(whole, fields)


def _metadata(key: str) -> bool:
    return key.startswith("__")


def _layout(samples: list[Sample]) -> dict[str, list[Any]]:
    """Per field, its samples' end offsets (the byte fields) or values (metadata)."""
    return {
        key: [s[key] for s in samples] if _metadata(key) else list(itertools.accumulate(len(s[key]) for s in samples))
        for key in samples[0]
    }


def _size(fields: dict[str, list[Any]]) -> int:
    return sum(ends[-1] for key, ends in fields.items() if not _metadata(key))


def _fill(whole: torch.Tensor, samples: list[Sample], fields: dict[str, list[Any]]) -> None:
    flat, at = whole.numpy().data, 0
    for key, ends in fields.items():
        if _metadata(key):
            continue
        for sample, start, end in zip(samples, [0, *ends], ends):
            view, value = flat[at + start : at + end], sample[key]
            if isinstance(value, Member):
                value.read_into(view)
            else:
                view[:] = value
        at += ends[-1]


def _unpack(whole: torch.Tensor, fields: dict[str, list[Any]]) -> dict[str, Any]:
    """The batch of `_fill`'s bytes in ``whole``: its data tensors are views of it."""
    batch: dict[str, Any] = {}
    at = 0
    for key, spec in fields.items():
        if _metadata(key):
            batch[key] = spec
            continue
        batch[key] = (whole[at : at + spec[-1]], torch.tensor([0, *spec]))
        at += spec[-1]
    return batch


def _collate(job: EpochJob, physical: int, samples: list[Sample]) -> tuple[Any, tuple[int, int] | None]:
    """The batch, and the reused buffer it lies in (with ``job.buffers``, one of worker ``physical``'s; then the
    batch is `Packed`, unless no buffer was free)."""
    if job.buffers is None:
        return job.collate(samples), None
    fields = _layout(samples)
    k, buf, fresh = job.buffers.take(physical, max(_size(fields), 1))
    whole = _whole(buf)
    _fill(whole, samples, fields)
    if k is None:
        return _unpack(whole, fields), None
    return Packed(buf if fresh else None, fields), (physical, k)


def _whole(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage)


def _byte_tensor(n: int) -> torch.Tensor:
    """An uninitialised uint8 tensor; in a DataLoader worker, in shared memory from the start, as torch's
    default_collate makes its batches: passing it to the training process then copies nothing."""
    if get_worker_info() is None or n == 0:
        return torch.empty(n, dtype=torch.uint8)
    return _whole(torch.UntypedStorage._new_shared(n))


def as_is(item: Item) -> Item:
    """The DataLoader's collate_fn: items are batched by the worker already."""
    return item
