"""Files on the shared filesystem, for both sides: atomic text and JSON, directory fsync, an exclusive lock that holds
across hosts, writing into a user's folder without following links, and the mount that holds a path."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
import threading
import time
from collections.abc import Iterator, Sequence
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
    """Write JSON to ``path`` so that readers see the old file, or the whole new one: never a part (`write_atomic`)."""
    write_atomic(path, json.dumps(data, sort_keys=True, default=str), mode, sync_dir)


def write_atomic(path: Path, text: str, mode: int = 0o666, sync_dir: bool = True) -> None:
    """Write ``text`` to ``path`` so that readers see the old file, or the whole new one: never a part.

    The file is created with ``mode`` (narrowed by the umask), so it is never readable more widely, not even briefly.
    ``sync_dir=False`` leaves the fsync of its directory, which makes the new name durable, to the caller.
    """
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "w", encoding="utf-8") as fh:
        fh.write(text)
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


NOT_FOLLOWED = "a symbolic link: not followed (hpctrain writes only into folders it made or found as folders)"


@contextmanager
def folder_fd(root: Path, parts: Sequence[str]) -> Iterator[int]:
    """``root/parts...`` open (a file descriptor for ``dir_fd=``), the folders made where missing. ``root`` is the
    user's to name; below it no symbolic link is followed, whoever made it: OSError(ELOOP, NOT_FOLLOWED, that path)
    where a part is one, so that a writer never writes or deletes through one."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i, part in enumerate(parts):
            try:
                os.mkdir(part, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                path = str(root.joinpath(*parts[: i + 1]))
                if stat.S_ISLNK(os.lstat(part, dir_fd=fd).st_mode):
                    raise OSError(errno.ELOOP, NOT_FOLLOWED, path) from None
                raise OSError(exc.errno, exc.strerror, path) from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def write_new(dir_fd: int, name: str, data: bytes, mode: int = 0o666) -> bool:
    """Write ``data`` as the new file ``name`` in the folder open as ``dir_fd``; False (nothing written) where the
    name is taken, by a file or a link (never followed)."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
    except FileExistsError:
        return False
    with open(fd, "wb") as fh:
        fh.write(data)
    return True


def copy_new(source: Path, dest: Path, under: str) -> tuple[list[Path], list[Path]]:
    """Copy the files below ``source`` (not its ``__pycache__``) to ``dest/under`` keeping their layout and modes;
    files already there are kept, and no link below ``dest`` is followed (`folder_fd`, `write_new`). Returns the
    files written and the files kept."""
    written: list[Path] = []
    kept: list[Path] = []
    for path in sorted(source.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        relative = path.relative_to(source)
        with folder_fd(dest, [*Path(under).parts, *relative.parent.parts]) as fd:
            new = write_new(fd, relative.name, path.read_bytes(), path.stat().st_mode & 0o777)
        (written if new else kept).append(dest / under / relative)
    return written, kept


@dataclass(frozen=True)
class Mount:
    """One line of the mount table: where, what type (``fuse.sshfs``, ``nfs4``, ...), from what, and its options
    (the mount's and the file system's, together)."""

    point: str
    fstype: str
    source: str
    options: frozenset[str]
    device: tuple[int, int] | None = None  # major, minor: the st_dev of the files on it

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
        major, _, minor = fields[2].partition(":")
        device = (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None
        mounts.append(Mount(_unescape(fields[4]), rest[0], _unescape(rest[1]), frozenset(options), device))
    return mounts


def mount_of(path: Path, mountinfo: Path = MOUNTINFO) -> Mount | None:
    """The mount holding ``path`` (links resolved, a dangling one to its target), or None where the mount table
    cannot be read. A path not made yet is on the mount of its nearest existing folder."""
    real = Path(os.path.realpath(Path(path).expanduser().absolute()))
    existing = real
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        st_dev = existing.stat().st_dev
        return holding(str(real), parse_mountinfo(mountinfo.read_text()), (os.major(st_dev), os.minor(st_dev)))
    except OSError:
        return None


def holding(real_path: str, mounts: list[Mount], device: tuple[int, int] | None = None) -> Mount | None:
    """Of ``mounts`` (in mount order), the one holding ``real_path``: of the mount points above it, the longest
    whose device is ``device`` (the path's st_dev), the last mounted where two are the same. A mount over a parent
    folder hides the mounts under it from the path, which the device tells; where no device matches (btrfs
    subvolumes have devices of their own), the longest mount point above it."""
    inside = [m for m in mounts if real_path == m.point or real_path.startswith(m.point.rstrip("/") + "/")]
    same_device = [m for m in inside if m.device == device]
    return max(reversed(same_device or inside), key=lambda m: len(m.point), default=None)
