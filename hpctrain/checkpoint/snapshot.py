"""What an async save writes from: host copies of the state, taken before ``save`` returns or while
training goes on, and a check that no tensor was changed while it was still being read.

``copy`` modes of ``Checkpointer.save(async_=True)``:
  now         copied before save returns (training blocked for the copy)
  background  copied while the caller goes on; the caller calls ``Checkpointer.wait_snapshot()``
              before it next changes saved tensors in place (before the optimizer step)
  none        not copied: the caller hands over tensors it does not change (fresh copies of its own)
An in-place change to a torch tensor while it is being read bumps its version counter: the save then
fails with an error naming the tensor instead of committing a state torn between two steps. numpy
arrays have no such counter, so ``background`` copies them before save returns.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hpctrain.checkpoint.format import as_numpy, dtype_name, empty, is_host, numpy_dtype
from hpctrain.checkpoint.writer import Piece
from hpctrain.errors import CheckpointError

COPY_MODES = ("now", "background", "none")
_COPY_BLOCK = 64 << 20  # bytes per copy task: big enough to amortise, small enough to spread over threads


@dataclass(frozen=True)
class _Watched:
    """A source tensor still being read, and its version counter when the save began."""

    name: str
    tensor: Any
    version: int

    @staticmethod
    def of(pieces: list[Piece]) -> list[_Watched]:
        return [_Watched(p.name, p.data, p.data._version) for p in pieces if hasattr(p.data, "_version")]


def _check_unchanged(watched: list[_Watched], what: str) -> None:
    changed = sorted({w.name for w in watched if w.tensor._version != w.version})
    if changed:
        more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
        raise CheckpointError(
            f"tensor {changed[0]!r}{more} was changed in place while {what}; this save is "
            "abandoned: call Checkpointer.wait_snapshot() before changing saved tensors"
        )


@dataclass
class Snapshot:
    """A save's pieces on their way to being written; ``copied()`` gives them once they may be written."""

    pieces: list[Piece]
    _copies: list[Future[Any]] = field(default_factory=list)
    _events: list[Any] = field(default_factory=list)  # CUDA events of copies from an accelerator
    _copying: list[_Watched] = field(default_factory=list)  # checked once the copies are done
    _handed_over: list[_Watched] = field(default_factory=list)  # checked once written (copy="none")
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _outcome: CheckpointError | None = None
    _settled: bool = False

    def copied(self) -> list[Piece]:
        """Wait for the copies; raises if a source changed before its copy was done. Safe from any thread:
        the check is made once, before any caller is let go."""
        with self._lock:
            if not self._settled:
                for job in self._copies:
                    job.result()
                for event in self._events:
                    event.synchronize()
                try:
                    _check_unchanged(self._copying, "an async save was copying it")
                except CheckpointError as exc:
                    self._outcome = exc
                self._settled = True
        if self._outcome is not None:
            raise self._outcome
        return self.pieces

    def written(self) -> None:
        """Raises if a tensor handed over (``copy="none"``) changed while it was being written."""
        _check_unchanged(self._handed_over, "an async save (copy='none') was writing it")

    def release(self) -> None:
        """Let go of the tensors, sources and copies, once written: the save's thread and future outlive them."""
        self.pieces, self._copying, self._handed_over = [], [], []


class HostBuffers:
    """Host copies of the pieces of async saves, reused from save to save (fresh memory costs page faults)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, tuple[int, ...]], Any] = {}
        self._pool = ThreadPoolExecutor(max(2, min(8, os.cpu_count() or 2)), thread_name_prefix="hpctrain-ckpt-copy")
        self._streams: dict[Any, Any] = {}  # accelerator device -> its copy stream

    def snapshot(self, pieces: list[Piece], copy: str, *, host: bool = True) -> Snapshot:
        """Start copying ``pieces`` as ``copy`` says (see the module docstring); with "now", return when done.
        Without ``host``, pieces already on the host are passed on as they are, not copied."""
        if copy == "none":
            return Snapshot(pieces, _handed_over=_Watched.of(pieces))
        old, self._buffers = self._buffers, {}  # buffers of tensors no longer saved are let go
        snap = Snapshot([], _copying=_Watched.of(pieces) if copy == "background" else [])
        for p in pieces:
            if is_host(p.data) and not host:
                buf = p.data
            elif is_host(p.data):
                buf = self._buffer(
                    old,
                    p,
                    lambda p=p: empty(
                        tuple(p.data.shape), numpy_dtype(p.meta.dtype), torch_memory=not isinstance(p.data, np.ndarray)
                    ),
                )
                blocks = _blocks(buf, as_numpy(p.data))
                if copy == "background" and isinstance(p.data, np.ndarray):
                    for block in blocks:  # no version counter to catch a change: copied before save returns
                        np.copyto(*block)
                else:
                    snap._copies += [self._pool.submit(np.copyto, *block) for block in blocks]
            else:
                import torch

                buf = self._buffer(old, p, lambda p=p: torch.empty(p.data.shape, dtype=p.data.dtype, pin_memory=True))
                snap._events.append(self._from_device(buf, p.data))
            snap.pieces.append(replace(p, data=buf))
        if copy == "now":
            snap.copied()
        return snap

    def _from_device(self, buf: Any, src: Any) -> Any:
        """Copy ``src`` to pinned ``buf`` on a side stream, after the work queued so far; its completion event."""
        import torch

        stream = self._streams.get(src.device)
        if stream is None:
            stream = self._streams[src.device] = torch.cuda.Stream(src.device)
        stream.wait_stream(torch.cuda.current_stream(src.device))
        with torch.cuda.stream(stream):
            buf.copy_(src.detach(), non_blocking=True)
        src.record_stream(stream)  # the allocator must not reuse src's memory before the copy is done
        event = torch.cuda.Event()
        event.record(stream)
        return event

    def _buffer(self, old: dict[tuple[str, tuple[int, ...]], Any], p: Piece, make: Any) -> Any:
        key = (p.name, p.offset)
        buf = old.get(key)
        if buf is None or tuple(buf.shape) != tuple(p.data.shape) or dtype_name(buf) != p.meta.dtype:
            buf = make()
        self._buffers[key] = buf
        return buf

    def close(self) -> None:
        self._pool.shutdown()
        self._buffers.clear()
        self._streams.clear()


def _blocks(dst: np.ndarray, src: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(dst, src) pairs that together copy ``src`` into ``dst``, split so that threads can share the work."""
    if not src.flags.c_contiguous or src.nbytes <= _COPY_BLOCK:
        return [(dst, src)]
    d, s = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    return [(d[i : i + _COPY_BLOCK], s[i : i + _COPY_BLOCK]) for i in range(0, s.size, _COPY_BLOCK)]
