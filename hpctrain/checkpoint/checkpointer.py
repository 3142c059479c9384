"""The per-rank checkpoint API: save (sync or async), commit, retention, resume."""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from hpctrain.checkpoint.commit import (
    await_fragments,
    commit,
    remove,
    stale_dirs,
    write_failure,
    write_fragment,
    write_skip,
)
from hpctrain.checkpoint.manifest import Manifest, sha256
from hpctrain.checkpoint.naming import MANIFEST, tmp_name
from hpctrain.checkpoint.resume import Restored, load_latest
from hpctrain.checkpoint.retention import Retention, apply_retention
from hpctrain.checkpoint.rng import capture_rng_state
from hpctrain.checkpoint.snapshot import COPY_MODES, HostBuffers, Snapshot
from hpctrain.checkpoint.tree import flatten
from hpctrain.checkpoint.writer import plan, write_pieces
from hpctrain.contract import JobEnvironment
from hpctrain.errors import CheckpointError
from hpctrain.ledger.journal import Journal

log = logging.getLogger("hpctrain.checkpoint")


class Checkpointer:
    """Saves and restores one rank's part of the training state in ``directory``.

    Every rank constructs one with the same ``directory``, ``world_size`` and ``attempt`` and calls
    ``save`` for the same steps. Each rank writes its own Shards (``write=True``) and, if
    ``writes_replicated`` (default: rank 0), its full tensors; rank ``committer`` then commits.
    ``attempt`` names this run of the job identically on every rank (default: from torchrun or Slurm
    variables, else agreed over torch.distributed; a random one for a single rank). One training job
    writes a directory at a time: a new Checkpointer removes the unfinished saves of other attempts.
    Checkpoint records go to ``journal`` (default: the job's journal when run by hpctrain's sbatch script).
    Manifests and rank fragments (RNG states, lineage) are created with ``mode``: owner-only by default.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        attempt: str | None = None,
        writes_replicated: bool | None = None,
        committer: int = 0,
        retention: Retention | None = None,
        layout: dict[str, Any] | None = None,
        lineage: dict[str, Any] | None = None,
        journal: Journal | Literal["env"] | None = "env",
        if_busy: str = "wait",
        commit_timeout_s: float = 600.0,
        mode: int = 0o600,
    ):
        if if_busy not in ("wait", "skip"):
            raise ValueError(f"if_busy must be 'wait' or 'skip', not {if_busy!r}")
        if not 0 <= rank < world_size or not 0 <= committer < world_size:
            raise ValueError(f"rank {rank} and committer {committer} must lie in 0..{world_size - 1}")
        self.directory = Path(directory)
        self.rank, self.world_size, self.committer = rank, world_size, committer
        self.attempt = attempt or _agree_attempt(world_size)
        self.writes_replicated = rank == 0 if writes_replicated is None else writes_replicated
        self.retention = retention or Retention()
        self.layout, self.lineage = layout or {}, dict(lineage or {})
        self.journal = Journal.from_env() if journal == "env" else journal
        self.if_busy, self.commit_timeout_s, self.mode = if_busy, commit_timeout_s, mode
        self._saves = 0  # save() calls, skipped ones included: the same number on every rank
        self._inflight: Future[Path | None] | None = None
        self._snapshot: Snapshot | None = None  # of the save in flight
        self._buffers = HostBuffers()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="hpctrain-ckpt-save")
        # deleting a checkpoint takes a third of the time of writing one: not on the saving thread
        self._cleaner = ThreadPoolExecutor(1, thread_name_prefix="hpctrain-ckpt-clean")
        self.directory.mkdir(parents=True, exist_ok=True)
        if self.is_committer:
            remove(stale_dirs(self.directory, self.attempt, committed_step=-1))

    @property
    def is_committer(self) -> bool:
        return self.rank == self.committer

    def save(
        self,
        step: int,
        state: Any,
        *,
        cursor: dict[str, Any] | None = None,
        metrics: dict[str, float] | None = None,
        async_: bool = False,
        copy: str = "now",
    ) -> Future[Path | None]:
        """Save ``state`` (a mapping of tensors, Shards, nested containers and JSON values) as step ``step``.

        Sync: returns once committed. Async: the write and commit run on a background thread, from
        host copies of the state made as ``copy`` says (see ``snapshot``): "now" returns once they
        are made; "background" at once, and the caller calls ``wait_snapshot()`` before it changes
        saved tensors in place; "none" writes from the caller's tensors, which it must leave alone.
        The future's result is the committed path on the committing rank, else None. With a save in
        flight this waits, or skips if ``if_busy="skip"``. Raises the error of an earlier background save.
        """
        if not isinstance(step, int) or step < 0:
            raise ValueError(f"step must be a non-negative int, not {step!r}")
        if copy not in COPY_MODES:
            raise ValueError(f"copy must be one of {', '.join(COPY_MODES)}, not {copy!r}")
        self._saves += 1
        tmp = self.directory / tmp_name(step, f"{self.attempt}.{self._saves}")
        if self.if_busy == "skip" and self._inflight is not None and not self._inflight.done():
            log.info("checkpoint of step %d skipped: the previous save is still running", step)
            if self.world_size > 1:
                write_skip(tmp, self.rank)
            return _done(None)
        with self._announcing_failure(tmp):
            self.wait()
            leaves, skeleton = flatten(state)
            pieces = plan(leaves, self.writes_replicated)
            rank_info = {
                "tree": skeleton,
                "cursor": cursor,
                "rng": capture_rng_state(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
            }
            job = (step, tmp, rank_info, dict(metrics or {}), async_, time.monotonic())
            if not async_:  # accelerator tensors still go through the reused pinned buffers
                return _done(self._write_and_commit(self._buffers.snapshot(pieces, "now", host=False), *job))
            self._snapshot = self._buffers.snapshot(pieces, copy)
            self._inflight = self._executor.submit(self._write_and_commit, self._snapshot, *job)
            return self._inflight

    def wait_snapshot(self) -> None:
        """Wait until the save in flight no longer reads the caller's tensors, so that they may be changed
        (needed after ``save(async_=True, copy="background")``; returns at once otherwise). An error of the
        save is raised by the save, not here."""
        snapshot, self._snapshot = self._snapshot, None
        if snapshot is not None:
            try:
                snapshot.copied()
            except CheckpointError:
                pass

    def wait(self) -> Path | None:
        """Wait for the save in flight; raises its error. Returns its committed path (committer only)."""
        inflight, self._inflight, self._snapshot = self._inflight, None, None
        return inflight.result() if inflight is not None else None

    def _write_and_commit(
        self,
        snapshot: Snapshot,
        step: int,
        tmp: Path,
        rank_info: dict[str, Any],
        metrics: dict[str, float],
        async_: bool,
        started: float,
    ) -> Path | None:
        with self._announcing_failure(tmp):
            tmp.mkdir(parents=True, exist_ok=True)
            try:
                tensors = write_pieces(tmp, snapshot.copied())
                snapshot.written()
            finally:  # so that no tensor of this save is held once wait() returns
                snapshot.release()
            write_fragment(tmp, self.rank, {**rank_info, "tensors": tensors}, mode=self.mode)
        if not self.is_committer:
            return None
        fragments = await_fragments(tmp, self.world_size, self.commit_timeout_s)
        if fragments is None:
            log.info("checkpoint of step %d abandoned: a rank skipped it", step)
            return None
        header = {
            "step": step,
            "created": time.time(),
            "attempt": self.attempt,
            "world_size": self.world_size,
            "layout": self.layout,
            "lineage": self.lineage,
            "metrics": metrics,
        }
        tag = tmp.name.partition(".tmp-")[2]
        final = commit(tmp, fragments, header, tag, mode=self.mode)
        if self.journal:
            metric = self.retention.metric if self.retention.metric in metrics else None
            self.journal.write(
                "checkpoint",
                step=step,
                path=str(final),
                state="committed",
                bytes=Manifest.read(final).stored_bytes,
                duration_s=round(time.monotonic() - started, 3),
                manifest_sha256=sha256(final / MANIFEST),
                metric_name=metric,
                metric_value=metrics[metric] if metric else None,
                note=f"{'async' if async_ else 'sync'} save by {self.world_size} rank(s)",
            )
        try:
            apply_retention(self.directory, self.retention, tag, self.journal)
            # listed now: a later save's tmp directory must not be taken for a stale one
            self._cleaner.submit(remove, stale_dirs(self.directory, self.attempt, committed_step=step))
        except OSError as exc:  # the checkpoint is committed; failing to tidy up must not fail the save
            log.warning("after committing %s: cleaning up failed: %s", final, exc)
        return final

    @contextmanager
    def _announcing_failure(self, tmp: Path) -> Iterator[None]:
        """Let the committing rank know at once when this rank cannot deliver its part of a save."""
        try:
            yield
        except Exception as exc:
            if not self.is_committer:
                write_failure(tmp, self.rank, exc)
            raise

    def load_latest(self, like: Any = None, *, to: str = "torch") -> Restored | None:
        """Load this rank's state from the newest checkpoint that loads on every rank (see resume.load_latest).

        Call on the main thread, on every rank; checkpoints saved after it record it as their parent.
        """
        restored = load_latest(
            self.directory, like, rank=self.rank, to=to, journal=self.journal if self.is_committer else None
        )
        if restored is not None:
            self.lineage["parent"] = restored.path.name
        return restored

    def close(self) -> None:
        """Wait for the save in flight (raising its error) and release the threads and buffers."""
        try:
            self.wait()
        finally:
            self._executor.shutdown()
            self._cleaner.shutdown()
            self._buffers.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _done(value: Path | None) -> Future[Path | None]:
    future: Future[Path | None] = Future()
    future.set_result(value)
    return future


def _agree_attempt(world_size: int) -> str:
    """An id of this run of the job that every rank computes alike."""
    if world_size == 1:
        return uuid.uuid4().hex[:12]
    env = os.environ
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"{env['TORCHELASTIC_RUN_ID']}-r{env.get('TORCHELASTIC_RESTART_COUNT', 0)}"
    if step_id := JobEnvironment(env).step_id:
        return step_id
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        box = [uuid.uuid4().hex[:12]]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    raise CheckpointError(
        "several ranks but no attempt id: pass attempt=, run under torchrun or Slurm, "
        "or initialise torch.distributed first"
    )
