"""Pins: a checkpoint that a model version names is never deleted by retention.

A pin is a file beside the step directories, ``.pinned/<step dir>/<label>``, written by the login node that
registers the version; retention runs in the training job, which never opens the ledger, and reads the pins from
the checkpoint directory itself. Both sides hold the directory's pin lock (``.pinned/.lock``, a POSIX lock that
holds across hosts) while they decide: retention re-reads the pins under it right before it trashes, and a pin is
written under it only while its checkpoint is still there, so a checkpoint is either pinned or gone, never both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hpctrain.errors import CheckpointError
from hpctrain.files import exclusive_lock, fsync_dir

PINS = ".pinned"
LOCK = ".lock"
LOCK_TIMEOUT_S = 60.0


@contextmanager
def pin_lock(directory: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the pins of the checkpoint directory ``directory`` (TimeoutError after ``timeout_s``)."""
    where = directory / PINS
    where.mkdir(exist_ok=True)
    with exclusive_lock(where / LOCK, timeout_s):
        yield


def pin(ckpt: Path, label: str, record: dict[str, Any]) -> Path:
    """Pin the committed checkpoint directory ``ckpt`` with ``label`` (a file name: e.g. the model's name), the pin
    holding ``record`` (who pinned it, for ``pin_records``). Call it holding ``pin_lock``: CheckpointError if the
    checkpoint is gone (retention took it first)."""
    if not ckpt.is_dir():
        raise CheckpointError(f"{ckpt}: the checkpoint is gone (retention deleted it)")
    path = ckpt.parent / PINS / ckpt.name / label
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{label}.tmp")  # one name (the lock keeps other pinners out): a killed one's is reused
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def unpin(ckpt: Path, label: str) -> None:
    """Remove the pin ``label`` of ``ckpt`` (holding ``pin_lock``); nothing if it has none."""
    path = ckpt.parent / PINS / ckpt.name / label
    path.unlink(missing_ok=True)
    try:
        path.parent.rmdir()
    except OSError:  # other pins left (or the folder was gone)
        pass


def pins(ckpt: Path) -> list[str]:
    """The labels pinning ``ckpt``, sorted (none: retention may delete it)."""
    where = ckpt.parent / PINS / ckpt.name
    return sorted(p.name for p in where.iterdir() if not p.name.startswith(".")) if where.is_dir() else []


def pinned(directory: Path) -> set[str]:
    """Names of the step directories of ``directory`` that something pins."""
    where = directory / PINS
    return {d.name for d in where.iterdir() if pins(directory / d.name)} if where.is_dir() else set()


def pin_records(directory: Path) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(checkpoint, label, record) of each pin in ``directory`` that holds a record (older pins hold none)."""
    for name in sorted(pinned(directory)):
        ckpt = directory / name
        for label in pins(ckpt):
            try:
                record = json.loads((directory / PINS / name / label).read_text())
            except (OSError, ValueError):
                continue
            if isinstance(record, dict):
                yield ckpt, label, record
