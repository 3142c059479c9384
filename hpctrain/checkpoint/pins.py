"""Pins: a checkpoint that a model version names is never deleted by retention.

A pin is a file beside the step directories, ``.pinned/<step dir>/<label>``, written by the login node that
registers the version; retention runs in the training job, which never opens the ledger, and reads the pins from
the checkpoint directory itself.
"""

from __future__ import annotations

import os
from pathlib import Path

PINS = ".pinned"


def pin(ckpt: Path, label: str) -> Path:
    """Pin the committed checkpoint directory ``ckpt`` with ``label`` (a file name: e.g. "gpt@v3")."""
    path = ckpt.parent / PINS / ckpt.name / label
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{label}.{os.getpid()}")
    tmp.write_text(f"{ckpt.name}\n")
    os.replace(tmp, path)
    return path


def pins(ckpt: Path) -> list[str]:
    """The labels pinning ``ckpt``, sorted (none: retention may delete it)."""
    where = ckpt.parent / PINS / ckpt.name
    return sorted(p.name for p in where.iterdir() if not p.name.startswith(".")) if where.is_dir() else []


def pinned(directory: Path) -> set[str]:
    """Names of the step directories of ``directory`` that something pins."""
    where = directory / PINS
    return {d.name for d in where.iterdir() if pins(directory / d.name)} if where.is_dir() else set()
