"""Durable file writes on the shared filesystem, for both sides: atomic JSON, directory fsync."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: Any, mode: int = 0o666, sync_dir: bool = True) -> None:
    """Write JSON to ``path`` so that readers see the old file, or the whole new one: never a part.

    The file is created with ``mode`` (narrowed by the umask), so it is never readable more widely, not even briefly.
    ``sync_dir=False`` leaves the fsync of its directory, which makes the new name durable, to the caller.
    """
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w", encoding="utf-8") as fh:
        json.dump(data, fh, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)
