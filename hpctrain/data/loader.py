"""The training loop's loader: one data-parallel rank's batches, exact resume, bad shards set aside."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader, default_collate

from hpctrain.data.cache import CacheCounts, ShardCache
from hpctrain.data.index import ShardIndex, load_index
from hpctrain.data.plan import Position, Segment, consumed, plan_epoch, position_after
from hpctrain.data.quarantine import Quarantine
from hpctrain.data.source import seekable
from hpctrain.data.state import LAYOUT, LoaderState
from hpctrain.data.stats import LoaderStats
from hpctrain.data.worker import Buffers, EpochDataset, EpochJob, Item, Sample, as_is, collate_bytes
from hpctrain.errors import DataError
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.parent import die_with_parent

log = logging.getLogger("hpctrain.data")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def init_worker(_worker_id: int) -> None:
    """Workers leave preemption notices (USR2, TERM, HUP) to the training process, which stops at a step
    boundary; a worker killed by one would fail the step before its checkpoint.

    A worker dies with its training process (Linux's parent-death signal): left behind, it would hold
    the rank's inherited gloo sockets open, so the peers would not see the rank gone, and it would keep
    the job step alive until torch notices (up to 5 s) or Slurm's KillWait: an in-allocation restart
    would wait that long."""
    for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent()
    keep_freed_memory()


def keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for the next allocations rather than give it back to the kernel: a
    worker reads each sample into a new bytes object of up to megabytes, and memory given back and taken again
    is faulted in page by page each time. (Not glibc: nothing.)"""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest: allocations up to 32 MiB from the heap
    mallopt(M_TRIM_THRESHOLD, 1 << 30)  # the heap's top shrinks only past 1 GiB free


class ShardLoader:
    """Batches of this data-parallel rank's share of each epoch, in an order fixed by the seed.

    Pass the *data-parallel* rank and size, never the global rank: the tensor- and pipeline-parallel
    peers of a DP rank must build identical loaders to see identical batches. Iterating serves the
    current epoch from where the training loop stopped; once its last batch is taken, ``epoch``
    moves on and the next iteration serves the next epoch. Only the last batch of an epoch may be
    short. Do not iterate the same loader twice at once.

    Batches are ``collate(samples)`` of webdataset samples ({"__key__": ..., extension: value}), by
    default torch's ``default_collate`` of samples decoded by webdataset's default decoder (.npy ->
    array, .txt, .json, .cls, ...). With ``decode=False`` samples keep the stored bytes and the default
    batch is ``collate_bytes``'s: per field, one uint8 tensor of them end to end plus offsets. With
    ``reuse_buffers`` (undecoded, default batches, workers >= 1) each worker reads its batches (a local shard's
    bytes straight from the file) into a few shared-memory buffers it reuses (`hpctrain.data.worker.Buffers`)
    instead of a new segment per batch, which saves the first touch of every page (most of the loader's CPU
    time): a batch is then valid only until the next one is asked for, so copy what must outlive a step.
    """

    _positions: list[Position]  # per logical worker: where its next batch starts in its plan
    _fell_back = False  # the cache alert given

    def __init__(
        self,
        index: ShardIndex | str | Path,
        *,
        batch_size: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        workers: int = 2,
        seed: int = 0,
        shuffle_buffer: int = 1000,
        decode: bool = True,
        collate: Callable[[list[Sample]], Any] | None = None,
        max_quarantined_fraction: float = 0.05,
        prefetch_factor: int = 2,
        journal: Journal | None = None,
        reuse_buffers: bool = False,
        cache: ShardCache | None = None,
    ):
        if reuse_buffers and (decode or collate is not None):
            raise ValueError("reuse_buffers needs decode=False and the default collate (batches of stored bytes)")
        if not 0 <= dp_rank < dp_size or batch_size < 1 or workers < 0:
            raise ValueError(
                f"need 0 <= dp_rank < dp_size, batch_size >= 1, workers >= 0; got "
                f"dp_rank={dp_rank} dp_size={dp_size} batch_size={batch_size} workers={workers}"
            )
        self.index = index if isinstance(index, ShardIndex) else load_index(index)
        if self.index.total_samples < dp_size:
            raise DataError(
                f"{self.index.path}: {self.index.total_samples} samples cannot feed {dp_size} data-parallel ranks"
            )
        self.batch_size, self.dp_rank, self.dp_size, self.workers = batch_size, dp_rank, dp_size, workers
        self.seed, self.shuffle_buffer, self.decode = seed, shuffle_buffer, decode
        self.collate = collate or (default_collate if decode else collate_bytes)
        self.prefetch_factor = prefetch_factor
        self.reuse_buffers = reuse_buffers and workers > 0
        self.cache = cache
        self.stats = LoaderStats(cache=CacheCounts() if cache is not None else None)
        self.journal = journal if journal is not None else Journal.from_env()
        self.quarantine = Quarantine(self.index, self.journal, max_quarantined_fraction)
        self.quarantine.check()
        if pipes := sum(not seekable(self.index.location(s)) for s in self.index.shards):
            log.info(
                "%s: %d of %d shards are pipe: commands, which cannot seek: reading one from sample k (on resume, "
                "or where the epoch's plan splits it between readers) reads and discards the bytes before k",
                self.index.path,
                pipes,
                len(self.index.shards),
            )
        self._start_epoch(0)

    def __len__(self) -> int:
        """Batches per epoch (fewer when shards are quarantined)."""
        return -(-(self.index.total_samples // self.dp_size) // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        # A worker's buffers: its batches in flight (the DataLoader's prefetch, the one it fills among them), the one
        # the training loop holds.
        buffers = Buffers(self.workers, self.prefetch_factor + 1) if self.reuse_buffers else None
        job = EpochJob(
            self.index,
            self._plan,
            list(self._positions),
            self._next_worker,
            self.seed,
            self.epoch,
            self.shuffle_buffer,
            self.batch_size,
            self.decode,
            self.collate,
            buffers,
            self.cache,
        )
        items = DataLoader(
            EpochDataset(job),
            batch_size=None,
            # with batch_size=None the DataLoader passes collate_fn each item, not the list torch's hint expects
            collate_fn=as_is,  # type: ignore[arg-type]
            num_workers=self.workers,
            prefetch_factor=self.prefetch_factor if self.workers else None,
            worker_init_fn=init_worker if self.workers else None,
        )
        since = self.stats.waiting()
        for item in items:
            self._consume(item)
            if item.batch is not None:
                self.stats.served(since)
                if buffers is not None and item.slot is not None:
                    yield buffers.unpack(item.slot, item.batch)
                    buffers.give_back(item.slot)
                else:
                    yield item.batch
                since = self.stats.waiting()

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop is (not the workers, which run ahead); JSON-ready for checkpoints."""
        positions = tuple(
            (self._shard_name(segs, seg), offset) for segs, (seg, offset) in zip(self._plan, self._positions)
        )
        return LoaderState(
            self.index.digest,
            self.seed,
            self.epoch,
            self.dp_rank,
            self.dp_size,
            self.workers,
            self.batch_size,
            self.shuffle_buffer,
            self._next_worker,
            positions,
        ).to_dict()

    def exact_state(self, states: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
        """The first of ``states`` (say, every rank's of a checkpoint written with another parallel layout)
        that this loader resumes exactly: taken with the same dp rank and size, workers, batch and shuffle
        buffer; None if there is none."""
        mine = {k: getattr(self, k) for k in LAYOUT}
        return next((s for s in states if LoaderState.from_dict(s).layout == mine), None)

    def load_state_dict(self, state: dict[str, Any], *, approximate: bool = False) -> None:
        """Resume exactly where ``state`` was taken.

        A state saved with another dp_rank, dp_size, worker count, batch size or shuffle buffer cannot
        be resumed exactly: DataError, unless ``approximate``, which resumes every worker at the fraction
        of the epoch the saved rank had consumed (in that epoch some samples may repeat or be missed).
        """
        saved = LoaderState.from_dict(state)
        if saved.index != self.index.digest:
            raise DataError(
                f"loader state was saved for another dataset (index digest {saved.index}, "
                f"{self.index.path} has {self.index.digest})"
            )
        if saved.seed != self.seed:
            raise DataError(f"loader state was saved with seed {saved.seed}, this loader has seed {self.seed}")
        mine = {k: getattr(self, k) for k in saved.layout}
        if saved.layout == mine:
            self._start_epoch(saved.epoch)
            self._positions = [self._position(saved, segs, w) for w, segs in enumerate(self._plan)]
            self._next_worker = saved.next_worker
            return
        if not approximate:
            raise DataError(
                f"loader state was saved with {_fmt(saved.layout)}, this loader has {_fmt(mine)}: "
                f"exact resume is impossible; resume with approximate=True to continue epoch "
                f"{saved.epoch} at the same fraction (some samples may repeat or be missed)"
            )
        old_plan = self._plan_for(saved.epoch, saved.dp_rank, saved.dp_size, max(saved.workers, 1), saved.batch_size)
        done = sum(consumed(segs, self._position(saved, segs, w)) for w, segs in enumerate(old_plan))
        fraction = done / sum(s.length for segs in old_plan for s in segs)
        self._start_epoch(saved.epoch)
        self._positions = [position_after(segs, self._batches_in(fraction, segs)) for segs in self._plan]
        self._next_epoch_if_done()

    def _batches_in(self, fraction: float, segments: Sequence[Segment]) -> int:
        """``fraction`` of a worker's share, in whole batches so that batches stay full."""
        total = sum(s.length for s in segments)
        return min(total, round(fraction * total / self.batch_size) * self.batch_size)

    @property
    def _lanes(self) -> int:
        """Logical workers: the DataLoader's, or one when it reads in this process."""
        return max(self.workers, 1)

    def _plan_for(self, epoch: int, dp_rank: int, dp_size: int, lanes: int, batch_size: int) -> list[list[Segment]]:
        return plan_epoch(
            [s.samples for s in self.index.shards],
            seed=self.seed,
            epoch=epoch,
            dp_rank=dp_rank,
            dp_size=dp_size,
            workers=lanes,
            batch_size=batch_size,
        )

    def _start_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._plan = self._plan_for(epoch, self.dp_rank, self.dp_size, self._lanes, self.batch_size)
        self._positions = [(0, 0)] * self._lanes
        self._next_worker = 0

    def _consume(self, item: Item) -> None:
        """Account for an item the training loop is about to take; DataError for a shard a worker could not read
        (the position stays at the last batch taken)."""
        for bad in item.quarantined:
            self.stats.skipped_samples += bad.skipped
            self.stats.quarantined_shards += 1
            self.quarantine.add(self.index.shards[bad.shard], bad.reason, bad.skipped)
        if item.cache is not None and self.stats.cache is not None:
            self.stats.cache.add(item.cache)
            if item.cache.fallbacks and not self._fell_back:
                self._fell_back = True
                self._alert_fallback(item.cache_fallback or "")
            if item.batch is None and not item.quarantined and item.error is None:
                return  # a worker's last word on the cache after its last batch: nothing to take
        if item.error is not None:
            raise DataError(item.error)
        self.stats.samples += item.samples
        self.stats.bytes += item.nbytes
        self._positions[item.worker] = item.position
        self._next_worker = (item.worker + 1) % self._lanes
        self._next_epoch_if_done()

    def _alert_fallback(self, why: str) -> None:
        """Shards are read from their source, not the node's cache (the job goes on): logged once a loader,
        journaled once a run and node."""
        message = f"shards read from their source, not the node's cache: {why}"
        log.warning("%s", message)
        if self.journal is not None:
            with contextlib.suppress(OSError):
                self.journal.write_once("cache_fallback", message=message)

    def _next_epoch_if_done(self) -> None:
        if all(seg == len(segs) for (seg, _), segs in zip(self._positions, self._plan)):
            self._start_epoch(self.epoch + 1)

    def _shard_name(self, segments: Sequence[Segment], seg: int) -> str | None:
        return self.index.shards[segments[seg].shard].name if seg < len(segments) else None

    def _position(self, saved: LoaderState, segments: Sequence[Segment], worker: int) -> Position:
        """Worker ``worker``'s saved (shard, offset) as a position in ``segments``; DataError if it is not there."""
        shard, offset = saved.positions[worker]
        if shard is None:
            return len(segments), 0
        for i, segment in enumerate(segments):
            if self.index.shards[segment.shard].name == shard and offset < segment.length:
                return i, offset
        raise DataError(
            f"loader state: worker {worker} at {shard} offset {offset} is not in its share of epoch {saved.epoch}"
        )


def _fmt(layout: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in layout.items())
