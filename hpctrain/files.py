"""Files on the shared filesystem, for both sides: atomic JSON, directory fsync, an exclusive lock that holds across
hosts, and the mount that holds a path."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MOUNTINFO = Path("/proc/self/mountinfo")


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


_IN_PROCESS: dict[str, threading.Lock] = {}  # POSIX locks belong to a process: its threads take turns here first
_IN_PROCESS_GUARD = threading.Lock()


@contextmanager
def exclusive_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold ``path`` (created if missing) exclusively: a POSIX record lock (fcntl), the kind SQLite takes, so it holds
    across the hosts sharing the file system wherever the ledger may live (hpctrain.ledger.storage). flock, which
    filelock takes, stays on each host on NFS mounted local_lock=flock. TimeoutError after ``timeout_s``; the lock
    goes with the process, also when it is killed."""
    with _IN_PROCESS_GUARD:
        local = _IN_PROCESS.setdefault(os.path.realpath(path), threading.Lock())
    deadline = time.monotonic() + timeout_s
    if not local.acquire(timeout=max(timeout_s, 0.0)):
        raise TimeoutError(f"{path}: held for over {timeout_s:g}s")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EACCES, errno.EAGAIN):
                        raise
                    if time.monotonic() >= deadline:
                        raise TimeoutError(f"{path}: held for over {timeout_s:g}s") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # releases the lock
    finally:
        local.release()


@dataclass(frozen=True)
class Mount:
    """One line of the mount table: where, what type (``fuse.sshfs``, ``nfs4``, ...), from what, and its options
    (the mount's and the file system's, together)."""

    point: str
    fstype: str
    source: str
    options: frozenset[str]

    def option(self, name: str) -> str | None:
        """The value of option ``name`` (``""`` for a flag), or None where the mount does not have it."""
        for opt in self.options:
            key, _, value = opt.partition("=")
            if key == name:
                return value
        return None


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts of a ``/proc/<pid>/mountinfo`` text (proc(5): the fields after " - " are the type, the source
    and the file system's own options)."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 6 or len(rest) < 2:
            continue
        options = fields[5].split(",") + (rest[2].split(",") if len(rest) > 2 else [])
        mounts.append(Mount(_unescape(fields[4]), rest[0], _unescape(rest[1]), frozenset(options)))
    return mounts


def mount_of(path: Path, mountinfo: Path = MOUNTINFO) -> Mount | None:
    """The mount holding ``path`` (its nearest existing folder, links resolved), or None where the mount table
    cannot be read."""
    target = Path(path).expanduser().absolute()
    while not target.exists() and target != target.parent:
        target = target.parent
    real = os.path.realpath(target)
    try:
        return holding(real, parse_mountinfo(mountinfo.read_text()))
    except OSError:
        return None


def holding(real_path: str, mounts: list[Mount]) -> Mount | None:
    """Of ``mounts`` (in mount order), the one holding ``real_path``: the longest mount point above it, the last
    mounted where two are the same."""
    inside = [m for m in mounts if real_path == m.point or real_path.startswith(m.point.rstrip("/") + "/")]
    return max(reversed(inside), key=lambda m: len(m.point), default=None)
