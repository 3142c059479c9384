"""Names of checkpoint directories: committed ``step_<N>``, in-progress ``.tmp-<id>``, doomed ``.trash-<id>``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
TENSORS = "tensors"  # arrays live under <checkpoint>/tensors/<name>, apart from the manifest and rank fragments
ZARR_NODE = "zarr.json"  # a zarr v3 node's metadata: each array's (tensorstore writes it), the step's and tensors/'s

_NAME = re.compile(r"^step_(\d+)(?:\.(tmp|trash)-(.+))?$")


@dataclass(frozen=True)
class StepDir:
    path: Path
    step: int
    kind: str  # "committed", "tmp" or "trash"
    tag: str | None = None  # the <id> of tmp and trash directories


def task_dir(directory: Path, task_index: int) -> Path:
    """Where a job's checkpoints go: each array task (sweep trial) of the job in its own subdirectory."""
    return directory / f"task-{task_index}" if task_index >= 0 else directory


def committed_name(step: int) -> str:
    return f"step_{step:08d}"


def tmp_name(step: int, tag: str) -> str:
    return f"{committed_name(step)}.tmp-{tag}"


def trash_name(step: int, tag: str) -> str:
    return f"{committed_name(step)}.trash-{tag}"


def parse(path: Path) -> StepDir | None:
    m = _NAME.match(path.name)
    if not m:
        return None
    return StepDir(path, int(m[1]), m[2] or "committed", m[3])


def list_dirs(directory: Path, kind: str | None = "committed") -> list[StepDir]:
    """Step directories of ``kind`` (None: all) in ``directory``, by step then name (padding is optional)."""
    if not directory.is_dir():
        return []
    found = (parse(p) for p in directory.iterdir() if p.is_dir())
    return sorted((d for d in found if d and (kind is None or d.kind == kind)), key=lambda d: (d.step, d.path.name))
