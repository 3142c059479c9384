"""Find the newest checkpoint that can be trusted, and resume from it, falling back past corrupt ones."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.manifest import Manifest, NewerFormatError
from hpctrain.checkpoint.naming import StepDir, list_dirs
from hpctrain.checkpoint.reader import load, quick_check, verify
from hpctrain.errors import CheckpointError
from hpctrain.ledger.journal import Journal
from hpctrain.parallel.collective import all_reduce_int

log = logging.getLogger("hpctrain.checkpoint")


@dataclass(frozen=True)
class Status:
    dir: StepDir
    manifest: Manifest | None
    problem: str | None  # why it is not trusted
    newer: bool = False  # written by a newer hpctrain: not corrupt, this one cannot read it


def statuses(directory: str | Path, *, full: bool = False) -> Iterator[Status]:
    """Committed checkpoints newest first, checked lazily: quickly (manifest, chunk files) or, with
    ``full``, by reading every chunk against its checksum."""
    for d in reversed(list_dirs(Path(directory))):
        try:
            yield Status(d, verify(d.path) if full else quick_check(d.path), None)
        except CheckpointError as exc:
            yield Status(d, None, str(exc), isinstance(exc, NewerFormatError))


def _resumable(directory: str | Path, *, full: bool = False) -> Iterator[Status]:
    """``statuses``, raising at a checkpoint of a newer format: resuming from an older one instead would go
    back in time, and its later saves would overwrite the newer work."""
    for status in statuses(directory, full=full):
        if status.newer:
            raise CheckpointError(
                f"{status.problem}: written by a newer hpctrain; upgrade hpctrain to resume "
                "from it (or move it away to resume from an older checkpoint)"
            )
        yield status


def record_corrupt(path: Path, step: int, problem: str, journal: Journal | None) -> None:
    if journal:
        journal.write("checkpoint", step=step, path=str(path), state="corrupt", note=problem)


def report_corrupt(path: Path, step: int, problem: str, journal: Journal | None) -> None:
    log.warning("checkpoint not usable: %s", problem)
    record_corrupt(path, step, problem, journal)


def latest_valid(directory: str | Path, *, full: bool = False, journal: Journal | None = None) -> Path | None:
    """The newest committed checkpoint that checks out (see ``statuses``); the ones skipped are
    logged and recorded as corrupt in ``journal``; a newer-format one raises (see ``_resumable``).
    Chunk checksums are verified on load."""
    for status in _resumable(directory, full=full):
        if status.manifest:
            return status.dir.path
        report_corrupt(status.dir.path, status.dir.step, status.problem or "", journal)
    return None


@dataclass(frozen=True)
class Restored:
    path: Path
    step: int
    state: Any
    cursor: Any  # this rank's data-loader cursor as saved (None if the rank did not exist then)
    rng: dict[str, Any] | None  # this rank's RNG states, for restore_rng_state
    manifest: Manifest


def load_latest(
    directory: str | Path,
    like: Any = None,
    *,
    rank: int = 0,
    to: str = "torch",
    journal: Journal | None = None,
    agree: Callable[[bool], bool] | None = None,
) -> Restored | None:
    """Load the newest checkpoint that loads cleanly on every rank; None if ``directory`` has none.

    A checkpoint whose chunks fail their checksums on any rank is reported and the previous one is
    tried; if none is usable this raises rather than let training start over unnoticed, and so does a
    checkpoint of a newer format (see ``_resumable``).
    ``agree(ok)`` must return whether all ranks succeeded (default: an all-reduce when
    torch.distributed is initialised, else ``ok``); call from the main thread.
    """
    agree = agree or _all_ranks_ok
    problems = []
    for status in _resumable(directory):  # every rank walks the same list and agrees on each candidate
        state, problem = None, status.problem
        if status.manifest:
            try:
                state = load(status.dir.path, like, rank=rank, to=to)
            except CheckpointError as exc:
                problem = str(exc)
        if problem is not None:
            report_corrupt(status.dir.path, status.dir.step, problem, journal)
        if agree(problem is None):
            assert status.manifest is not None  # a status without a manifest has a problem
            saved = status.manifest.ranks.get(rank, {})
            return Restored(
                status.dir.path, status.manifest.step, state, saved.get("cursor"), saved.get("rng"), status.manifest
            )
        problems.append(problem or f"{status.dir.path}: failed to load on another rank")
    if problems:
        raise CheckpointError(
            f"{directory}: none of its {len(problems)} checkpoints is usable (newest: "
            f"{problems[0]}); move them away to start afresh"
        )
    return None


def _all_ranks_ok(ok: bool) -> bool:
    return bool(all_reduce_int(int(ok), "min"))
