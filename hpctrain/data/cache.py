"""A node's cache of shards (site `[cache]`, spec `data.cache`): each shard fetched once per node from wherever its
index says it is, verified against the index's sha256, kept across epochs, requeues and jobs, shared by the node's
ranks and their loader workers.

Content-addressed: ``<dir>/hpctrain-<uid>/shards/<sha256>.tar``, whatever the source (a path, ``pipe:``, http). Two
`flock` files a shard, released by the kernel with the process that held them (a killed rank leaves none held):
  use    shared while a reader has the shard open; an eviction takes it exclusively, without waiting, so a shard
         in use is never evicted;
  fetch  exclusive while one process fetches (or re-verifies) the shard; the node's other readers of it wait on it,
         then read the copy.
A fetch writes to a temporary name, checks the bytes' size and sha256 against the index and renames: a rank killed
mid-fetch leaves no file under a shard's name. A verified copy is remembered by its inode, size and ctime (a
`.ok` file beside it, whose mtime is the copy's last use): a copy changed on disk after it was verified changes its
ctime, is hashed again, and when it no longer matches is counted corrupt, removed and fetched again, never read.

Before a fetch, under the node's `room` lock, copies least recently used are evicted until the new shard fits under
``max_size`` with ``min_free`` left on the disk, beside the fetches under way, and the fetch's temporary file is
allocated at the shard's size (so fetches of different shards at once stay under the limits together). When it
cannot fit, or the directory cannot be written (full, read-only, not there), the shard is read from its source as
without a cache, and the job says so once (`CacheFallback`); the job never fails for it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.data.source import open_shard
from hpctrain.data.tarshard import ShardCorrupt
from hpctrain.errors import DataError

if TYPE_CHECKING:
    from hpctrain.config.site import SiteConfig

SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 4 << 20  # bytes copied (and hashed) at a time
FETCHES = 2  # tries of a source whose bytes do not match the index before the shard is taken as corrupt
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT)


@dataclass
class CacheCounts:
    """What a process's reads of the cache did: shards read from it (``hits``) or fetched (``misses``, of which
    ``waited`` found another process fetching), copies found corrupt, bytes read from the sources and from the
    cache, seconds spent fetching or waiting for a fetch, shards read from their source for want of room."""

    hits: int = 0
    misses: int = 0
    waited: int = 0
    corrupt: int = 0
    source_bytes: int = 0
    cache_bytes: int = 0
    fetch_wait_s: float = 0.0
    fallbacks: int = 0

    def add(self, other: CacheCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def taken(self) -> CacheCounts:
        """These counts, and zero here (what a worker sends with its next batch)."""
        out = CacheCounts(**{f.name: getattr(self, f.name) for f in fields(self)})
        for f in fields(self):
            setattr(self, f.name, type(getattr(self, f.name))())
        return out


@dataclass(frozen=True)
class CachedCopy:
    """A shard's copy in the cache: its sha256, size, last use, whether it is the copy verified last, and whether a
    process reads or fetches it now."""

    sha256: str
    bytes: int
    last_used: float
    verified: bool
    in_use: bool


class CacheFallback(Exception):
    """The shard cannot be cached (why, in one line): it is read from its source."""


class ShardCache:
    """The cache under ``root`` (a node-local directory), at most ``max_bytes`` (None: as the disk allows) with
    ``min_free_bytes`` left free on its file system; loader workers fetch up to ``prefetch_bytes`` past the shard
    they read. Picklable: each loader worker opens its own locks."""

    def __init__(self, root: Path, max_bytes: int | None = None, min_free_bytes: int = 0, prefetch_bytes: int = 0):
        self.dir = Path(root) / f"hpctrain-{os.getuid()}"
        self.max_bytes, self.min_free_bytes = max_bytes, min_free_bytes
        self.prefetch_bytes = prefetch_bytes  # how far past its shard a loader worker fetches (hpctrain.data.prefetch)
        self.counts = CacheCounts()
        self.fallback: str | None = None  # why this process last read a shard from its source instead

    @property
    def shards(self) -> Path:
        return self.dir / "shards"

    def path(self, sha: str) -> Path:
        return self.shards / f"{sha}.tar"

    @contextlib.contextmanager
    def location(self, index: ShardIndex, info: ShardInfo) -> Iterator[str]:
        """Where to read ``info`` from while the block runs: its cached copy (fetched first if need be, kept from
        eviction until the block ends), or its source where it cannot be cached. ShardCorrupt when the source's
        bytes are not the index's."""
        if not SHA256.fullmatch(info.sha256):  # not an index hpctrain wrote: nothing to address it by
            yield index.location(info)
            return
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(self._lock(info.sha256, "use", fcntl.LOCK_SH))
                self._ensure(index, info)
            except (OSError, CacheFallback) as exc:
                self._fell_back(str(exc) if isinstance(exc, CacheFallback) else f"{self.dir}: {exc.strerror or exc}")
                where = index.location(info)
            else:
                self.counts.cache_bytes += info.bytes
                where = str(self.path(info.sha256))
            yield where

    def prefetch(self, index: ShardIndex, info: ShardInfo) -> None:
        """Fetch ``info`` into the cache unless it is there (hpctrain.data.prefetch); what fails is left to its
        reader, whose own read fails, or falls back, as it would have."""
        if SHA256.fullmatch(info.sha256):
            with contextlib.suppress(OSError, CacheFallback, ShardCorrupt, DataError):
                with self._lock(info.sha256, "use", fcntl.LOCK_SH):
                    self._ensure(index, info, reading=False)

    def _ensure(self, index: ShardIndex, info: ShardInfo, reading: bool = True) -> None:
        """A verified copy of ``info`` in the cache (fetched, or verified again, under its fetch lock); counted as a
        read (``reading``) or only as a fetch."""
        sha = info.sha256
        if self._verified(sha):
            self.counts.hits += reading
            self._touch(sha)
            return
        started = time.perf_counter()
        try:
            with self._lock(sha, "fetch", fcntl.LOCK_EX):
                if self._verified(sha):  # another process or thread fetched it meanwhile
                    self.counts.waited += reading
                    self.counts.hits += reading
                elif self._rehashed(info):
                    self.counts.hits += reading
                else:
                    self.counts.misses += 1
                    self._fetch(index, info)
                self._touch(sha)
        finally:
            if reading:
                self.counts.fetch_wait_s += time.perf_counter() - started

    def copies(self) -> list[CachedCopy]:
        """Every copy in the cache, most recently used first."""
        if not self.shards.is_dir():
            return []
        return [
            CachedCopy(sha, size, last, self._verified(sha), self._in_use(sha))
            for last, size, sha in sorted(self._copies(), reverse=True)
        ]

    def verify(self, sha: str) -> bool | None:
        """Hash one copy again, waiting for a fetch of it under way (`_check`)."""
        with self._lock(sha, "fetch", fcntl.LOCK_EX):
            return self._check(sha)

    def evict(self, sha: str) -> bool:
        """Remove one copy unless a process reads or fetches it; whether it was removed."""
        return self._evict(sha)

    def _in_use(self, sha: str) -> bool:
        try:
            with self._lock(sha, "use", fcntl.LOCK_EX | fcntl.LOCK_NB):
                return False
        except BlockingIOError:
            return True

    def _verified(self, sha: str) -> bool:
        """Whether the copy is the one verified last (same inode, size and ctime as its `.ok` file says)."""
        try:
            known = json.loads(self._ok(sha).read_text(encoding="utf-8"))
            return bool(known == _identity(self.path(sha).stat()))
        except (OSError, ValueError):
            return False

    def _rehashed(self, info: ShardInfo) -> bool:
        """A copy there but changed since it was verified (or never remembered): hashed again (`_check`), a copy that
        no longer matches counted corrupt."""
        matched = self._check(info.sha256)
        self.counts.corrupt += matched is False
        return bool(matched)

    def _check(self, sha: str) -> bool | None:
        """Hash the copy again (its name is its sha256): remembered as verified if it matches, removed if not; None
        when there is none."""
        try:
            with open(self.path(sha), "rb") as fh:
                good = _digest(fh) == sha
        except FileNotFoundError:
            return None
        if good:
            self._remember(sha)
        else:
            self._remove(sha)
        return good

    def _fetch(self, index: ShardIndex, info: ShardInfo) -> None:
        """The shard from its source into the cache, verified; ShardCorrupt when the source's bytes are wrong each
        time. CacheFallback when the cache's disk cannot take it."""
        location = index.location(info)
        for _ in range(FETCHES):
            tmp = self.shards / f".{info.sha256}.{os.getpid()}.{time.monotonic_ns()}.tmp"
            try:
                self._reserve(tmp, info.bytes)
                src, _size = open_shard(location)
                with src, open(tmp, "r+b") as dst:
                    got = _digest(src, dst)
                    size = dst.tell()
                    dst.truncate(size)
                self.counts.source_bytes += size
                if size == info.bytes and got == info.sha256:
                    # Under the room lock: a fetch counted neither as a temporary nor yet as a copy would let
                    # another fetch's reservation past the cap (_make_room reads the two one after the other).
                    with self._lock("node", "room", fcntl.LOCK_EX):
                        os.replace(tmp, self.path(info.sha256))
                    self._remember(info.sha256)
                    return
            except OSError as exc:
                if exc.errno in NO_ROOM:
                    raise CacheFallback(f"{self.dir}: {exc.strerror}") from None
                raise
            finally:
                tmp.unlink(missing_ok=True)
            self.counts.corrupt += 1
        raise ShardCorrupt(f"its bytes from {location} do not match the index's size and sha256 ({FETCHES} fetches)")

    def _reserve(self, tmp: Path, needed: int) -> None:
        """``tmp``, a fetch's file, made ``needed`` bytes long under the node's room lock once there is room for it:
        fetches of different shards at once each count the others' reservations, so together they stay under
        ``max_size`` and ``min_free``."""
        self.shards.mkdir(parents=True, exist_ok=True)
        with self._lock("node", "room", fcntl.LOCK_EX):
            self._make_room(needed)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                if needed:
                    os.posix_fallocate(fd, 0, needed)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, needed)  # a file system that cannot allocate ahead: at least its size counts
            finally:
                os.close(fd)

    def _make_room(self, needed: int) -> None:
        """Evict the least recently used copies not in use until ``needed`` more bytes fit beside the copies and the
        fetches under way; CacheFallback if they cannot."""
        self._clear_stale_temporaries()
        copies = sorted(self._copies(), key=lambda c: c[0])  # (last use, size, sha256), oldest first
        used = sum(size for _, size, _ in copies) + self._fetching()
        for _, size, sha in copies:
            if self._fits(needed, used):
                return
            if self._evict(sha):
                used -= size
        if not self._fits(needed, used):
            free = shutil.disk_usage(self.dir).free
            raise CacheFallback(
                f"{self.dir}: no room for {needed} bytes ({used} cached or being fetched, {free} free on its disk; "
                f"max_size {self.max_bytes}, min_free {self.min_free_bytes}; copies in use are kept)"
            )

    def _fits(self, needed: int, used: int) -> bool:
        if self.max_bytes is not None and used + needed > self.max_bytes:
            return False
        return shutil.disk_usage(self.dir).free - needed >= self.min_free_bytes

    def _copies(self) -> Iterator[tuple[float, int, str]]:
        """(last use, size, sha256) of each copy; one never remembered as verified counts as unused since 1970."""
        for path in self.shards.glob("*.tar"):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            try:
                last = self._ok(path.stem).stat().st_mtime
            except OSError:
                last = 0.0
            yield last, size, path.stem

    def _fetching(self) -> int:
        """Bytes reserved by the fetches under way (their temporary files; a `.ok` file's are not fetches)."""
        total = 0
        for tmp in self.shards.glob(".*.tmp"):
            if ".ok." not in tmp.name:
                with contextlib.suppress(OSError):  # renamed or cleared meanwhile
                    total += tmp.stat().st_size
        return total

    def _evict(self, sha: str) -> bool:
        """Remove one copy if no process reads or fetches it (never waits for one that does)."""
        try:
            with (
                self._lock(sha, "use", fcntl.LOCK_EX | fcntl.LOCK_NB),
                self._lock(sha, "fetch", fcntl.LOCK_EX | fcntl.LOCK_NB),
            ):
                self._remove(sha)
                return True
        except BlockingIOError:
            return False

    def _remove(self, sha: str) -> None:
        self.path(sha).unlink(missing_ok=True)
        self._ok(sha).unlink(missing_ok=True)

    def _clear_stale_temporaries(self) -> None:
        """Temporary files of fetches whose process is gone (a rank killed mid-fetch)."""
        for tmp in self.shards.glob(".*.tmp"):
            parts = tmp.name.split(".")  # "", sha256, pid, ns, "tmp" (a fetch) or "", sha256, "ok", pid, ns, "tmp"
            pid = parts[2] if parts[2].isdigit() else parts[3] if len(parts) > 5 else ""
            if pid.isdigit() and not _alive(int(pid)):
                tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _lock(self, sha: str, kind: str, how: int) -> Iterator[None]:
        """One of the shard's flock files (``kind`` "use" or "fetch"), held as ``how`` says while the block runs."""
        locks = self.dir / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        fd = os.open(locks / f"{sha}.{kind}", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, how)
            yield
        finally:
            os.close(fd)

    def _ok(self, sha: str) -> Path:
        return self.shards / f"{sha}.ok"

    def _remember(self, sha: str) -> None:
        ok = self._ok(sha)
        tmp = ok.with_name(f".{ok.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
        tmp.write_text(json.dumps(_identity(self.path(sha).stat())), encoding="utf-8")
        os.replace(tmp, ok)

    def _touch(self, sha: str) -> None:
        with contextlib.suppress(OSError):
            os.utime(self._ok(sha))

    def _fell_back(self, why: str) -> None:
        self.counts.fallbacks += 1
        self.fallback = why


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_ino, st.st_size, st.st_ctime_ns]


def _digest(src: object, dst: object | None = None) -> str:
    """The sha256 of ``src``'s bytes (a binary file), copied on to ``dst`` if given."""
    h = hashlib.sha256()
    buf = memoryview(bytearray(CHUNK))
    read = getattr(src, "readinto1", None) or src.readinto  # type: ignore[attr-defined]  # what has come, not CHUNK
    while n := read(buf):
        h.update(buf[:n])
        if dst is not None:
            dst.write(buf[:n])  # type: ignore[attr-defined]
    return h.hexdigest()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def node_cache(setting: str | None) -> ShardCache | None:
    """The cache a job's `data.cache` (``setting``) reads through on this node: its site's `[cache]` (`site_cache`);
    None when off, outside a job's site, where the site has none, or where it cannot be had here (said in one
    line)."""
    from hpctrain.config.site import job_site

    site = job_site() if setting != "off" else None
    if site is None:
        return None
    try:
        return site_cache(site)
    except CacheFallback as exc:
        print(f"hpctrain: no shard cache: {exc}", file=sys.stderr)
        return None


def site_cache(site: SiteConfig) -> ShardCache | None:
    """``site``'s cache on this host, its directory expanded here; None where the site has none; CacheFallback
    where the directory names a variable this host does not set."""
    from hpctrain.config.loading import expand_vars

    cfg = site.cache
    if cfg.dir is None:
        return None
    root = os.path.expanduser(expand_vars(cfg.dir))
    if "$" in root or not os.path.isabs(root):
        raise CacheFallback(f"[cache] dir {cfg.dir!r} is {root!r} on this host")
    return ShardCache(Path(root), _mib(cfg.max_size), _mib(cfg.min_free) or 0, _mib(cfg.prefetch) or 0)


def _mib(value: int | None) -> int | None:
    return None if value is None else value << 20
