"""Reading one WebDataset tar shard front to back, skipping the data of samples not wanted.

webdataset's tariterators stream every byte of a shard, so resuming mid-shard, or starting a
shard split between two readers at sample k, would read the whole prefix. Here the tar is opened
seekable: the samples before the wanted ones cost their headers only (where the source can seek,
see source), and the rest is one sequential read. Samples are grouped by key as webdataset does
(``key_and_extension``). A local file's headers are parsed here (`Shard.headers`; tarfile's
parsing costs more than reading a sample of a megabyte from the page cache), each field read with
one pread, or given as a `Member` (where its bytes lie) for a batch to be read straight into its
buffer, and the kernel is asked to read ahead of the headers walked. A stream (http, pipe) is read
by tarfile. `scan` reads a whole shard once, for indexing and verifying.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple

from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.data.source import open_shard
from hpctrain.errors import DataError

# webdataset's own rule (tariterators.base_plus_ext), kept here: importing webdataset imports torch, and
# `hpctrain data verify` runs on login nodes; tests/unit/data/test_data_loader.py checks the two agree.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def key_and_extension(name: str) -> tuple[str | None, str | None]:
    """'dir/000001.seg.npy' -> ('dir/000001', 'seg.npy'): a member's sample key and its field."""
    m = _KEY_EXT.match(name)
    return (m[1], m[2]) if m else (None, None)


class ShardCorrupt(Exception):
    """The shard cannot be read as its index describes it (the message is the reason)."""


@dataclass(frozen=True)
class Member:
    """A sample field's ``size`` bytes at ``offset`` of the local shard open as ``fd`` (valid while it is open)."""

    location: str
    fd: int
    offset: int
    size: int

    def __len__(self) -> int:
        return self.size

    def read_into(self, view: memoryview) -> None:
        """The bytes into ``view`` (``size`` long); DataError if they cannot be had (see `read`)."""
        self._check(self._io(os.preadv, [view], self.offset))

    def read(self) -> bytes:
        """The bytes. DataError if they cannot be had: the shard's size was checked against its index when
        opened, so a short read means it changed while being read."""
        data = self._io(os.pread, self.size, self.offset)
        self._check(len(data))
        return data

    def _io(self, call: Callable[..., Any], *args: Any) -> Any:
        try:
            return call(self.fd, *args)
        except OSError as exc:
            raise DataError(f"{self.location}: {exc.strerror or exc}") from None

    def _check(self, got: int) -> None:
        if got != self.size:
            raise DataError(
                f"{self.location}: {got} of {self.size} bytes at byte {self.offset}: the shard changed while being read"
            )


RawSample = dict[str, bytes | Member | str]
_READ_ERRORS = (OSError, tarfile.TarError, EOFError)
BLOCK = tarfile.BLOCKSIZE
_MAGIC = (b"ustar\0", b"ustar ")  # POSIX, GNU
# ustar's numbers, as tarfile.TarInfo.frombuf reads them (mode, uid, gid, size, mtime, devmajor, devminor, checksum)
_NUMBERS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (329, 337), (337, 345), (148, 156))
_PAX_KEEPS = {"path", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname", "comment"}
# A local shard's fields are read in the shuffle's order, not the file's, so the kernel sees no sequential reads
# to read ahead of: it is asked to, from the headers walked to READ_AHEAD past them, HINT_STEP at a time.
READ_AHEAD = 32 << 20
HINT_STEP = 4 << 20


class Shard:
    """An open shard, checked against its index's size where the source tells it up front (not ``pipe:``).
    Use as a context manager. DataError (from source) when the shard's bytes cannot be had at all."""

    def __init__(self, index: ShardIndex, info: ShardInfo, location: str | None = None):
        self.info = info
        self.location = location or index.location(info)  # ``location``: a copy of it (hpctrain.data.cache)
        self._file, size = open_shard(self.location)
        self._hinted = 0  # the kernel was asked to read the file up to here
        self._fd: int | None = _fileno(self._file)  # a local file's, read here; None: a stream, read by tarfile
        try:
            if size is not None and size != info.bytes:
                raise ShardCorrupt(f"size {size} bytes, index says {info.bytes}")
            self._tar = tarfile.open(fileobj=self._file, mode="r:")
        except _READ_ERRORS as exc:
            self._file.close()
            raise ShardCorrupt(f"unreadable tar: {exc}") from None
        except BaseException:
            self._file.close()
            raise

    def __enter__(self) -> Shard:
        return self

    def __exit__(self, *exc: object) -> None:
        self._tar.close()
        self._file.close()

    def samples(self, wanted: Sequence[int], located: bool = False) -> Iterator[tuple[int, RawSample]]:
        """(i, sample) for the ascending sample numbers ``wanted``, as {"__key__": key, extension: bytes}; with
        ``located``, each field of a local shard a `Member`, its bytes not read yet."""
        field: Callable[[Any], bytes | Member] = self._place if located and self._fd is not None else self._read
        members = _tar_members(self._tar) if self._fd is None else self.headers()
        targets = iter(wanted)
        target = next(targets, None)
        i, key = -1, None
        sample: RawSample = {}
        try:
            for member, member_key, extension in _sample_members(members):
                if member_key != key:
                    if i == target:
                        yield i, sample
                        target = next(targets, None)
                    if target is None:
                        return
                    i, key, sample = i + 1, member_key, {"__key__": member_key}
                if i == target:
                    sample[extension.lower()] = field(member)
        except _READ_ERRORS as exc:
            raise ShardCorrupt(f"unreadable tar after {i} samples: {exc}") from None
        if i == target:
            yield i, sample
            target = next(targets, None)
        if target is not None:
            raise ShardCorrupt(f"{i + 1} samples, index says {self.info.samples}")

    def headers(self) -> Iterator[Header | tarfile.TarInfo]:
        """A local shard's members from the start, their headers read with pread and parsed here (a tenth of
        tarfile's time, which is a sample's cost besides its bytes) while they are regular files' ustar headers,
        with or without a pax record (webdataset's TarWriter writes one per member); from the first that is not
        (GNU long names, directories, links, the end of the archive), tarfile reads on from there."""
        assert self._fd is not None
        fd, offset = self._fd, 0
        while (header := _header(fd, offset)) is not None:
            yield header
            offset = header.offset_data + _padded(header.size)
        self._file.seek(offset)
        with tarfile.open(fileobj=self._file, mode="r:") as rest:
            yield from _tar_members(rest)

    def _place(self, member: Header | tarfile.TarInfo) -> Member | bytes:
        """Where a local member's bytes lie; a sparse member's bytes (stored compacted: tarfile expands them)."""
        return self._read(member) if _sparse(member) else self._locate(member)

    def _read(self, member: Header | tarfile.TarInfo) -> bytes:
        if self._fd is not None and not _sparse(member):
            return self._locate(member).read()
        assert isinstance(member, tarfile.TarInfo)  # a stream's or a sparse one: headers parsed here are neither
        fh = self._tar.extractfile(member)  # any member, from its own offsets: also one of another TarFile here
        assert fh is not None  # a regular file
        return fh.read()

    def _locate(self, member: Header | tarfile.TarInfo) -> Member:
        end = member.offset_data + member.size
        if end > self.info.bytes:
            raise ShardCorrupt(f"member {member.name!r} ends at byte {end}, past the shard's end")
        assert self._fd is not None
        fd = self._fd
        if end + READ_AHEAD > self._hinted:  # in steps: each advice is a system call
            start = max(self._hinted, member.offset_data)
            self._hinted = end + READ_AHEAD + HINT_STEP
            if not _cached(fd, self._hinted - 1):  # the advice looks up each page: a tenth of copying it
                os.posix_fadvise(fd, start, self._hinted - start, os.POSIX_FADV_WILLNEED)
        return Member(self.location, fd, member.offset_data, member.size)

    def read_in_order(self, order: Sequence[int], located: bool = False) -> Iterator[tuple[int, RawSample]]:
        """(i, sample) for i in ``order``, reading the file front to back and holding only samples read ahead
        (with ``located``, see `samples`, only where their fields lie)."""
        ahead = self.samples(sorted(order), located)
        held: dict[int, RawSample] = {}
        for i in order:
            while i not in held:
                j, sample = next(ahead)
                held[j] = sample
            yield i, held.pop(i)


def _sparse(member: Header | tarfile.TarInfo) -> bool:
    return isinstance(member, tarfile.TarInfo) and member.sparse is not None


def _fileno(file: BinaryIO) -> int | None:
    try:
        return file.fileno()
    except OSError:  # io.UnsupportedOperation: a pipe's or http's stream
        return None


def _cached(fd: int, offset: int) -> bool:
    """Whether the byte at ``offset`` is in the page cache (taken to say its neighbours are too): a read that
    must not wait for the device. False where the file system cannot tell."""
    try:
        return os.preadv(fd, [bytearray(1)], offset, os.RWF_NOWAIT) == 1  # 0: past the end
    except OSError:  # EAGAIN: not cached; EOPNOTSUPP: no such reads here
        return False


class Header(NamedTuple):
    """A regular file's ustar header, as `_ustar` reads it."""

    name: str
    offset_data: int
    size: int

    def isreg(self) -> bool:
        return True


def _header(fd: int, offset: int) -> Header | None:
    """The regular file whose header (a pax record then a ustar header, or the ustar header alone) starts at
    ``offset``, read as tarfile reads it; None if it is anything else (tarfile's to read)."""
    fields = _ustar(os.pread(fd, BLOCK, offset))
    pax: dict[str, str] | None = {}
    if fields is not None and fields[0] == b"x":
        pax = _pax(os.pread(fd, fields[2], offset + BLOCK))
        offset += BLOCK + _padded(fields[2])
        fields = _ustar(os.pread(fd, BLOCK, offset))
    old_style_dir = fields is not None and fields[0] == b"\0" and fields[1].endswith("/")
    if fields is None or pax is None or fields[0] not in (b"0", b"\0") or old_style_dir:
        return None
    return Header(pax["path"].rstrip("/") if "path" in pax else fields[1], offset + BLOCK, fields[2])


def _ustar(block: bytes) -> tuple[bytes, str, int] | None:
    """(type, name, size) of the ustar header in ``block``, if it is one whose numbers tarfile would all read (no
    base-256 one among them) and whose checksum is valid; else None."""
    if len(block) < BLOCK or block[257:263] not in _MAGIC or any(block[a] & 0x80 for a, _ in _NUMBERS):
        return None
    try:
        numbers = [int(_cut(block[a:b]).strip() or b"0", 8) for a, b in _NUMBERS]
    except ValueError:
        return None
    size, checksum = numbers[3], numbers[-1]
    if checksum != 256 + sum(block) - sum(block[148:156]):
        return None
    name = os.fsdecode(_cut(block[:100]))  # tarfile's encoding, by default
    if prefix := _cut(block[345:500]):
        name = f"{os.fsdecode(prefix)}/{name}"
    return block[156:157], name, size


def _pax(data: bytes) -> dict[str, str] | None:
    """A pax record's keywords, if they are only those that leave a regular file's data where its ustar header says
    (not a size past 8 GiB, or sparse files); else None."""
    records, at = {}, 0
    try:
        while at < len(data) and data[at]:
            space = data.index(b" ", at)
            if not data[at:space].isdigit() or (length := int(data[at:space])) <= space - at:
                return None
            keyword, _, value = data[space + 1 : at + length - 1].partition(b"=")
            records[keyword.decode()] = value.decode("utf-8", "surrogateescape")
            at += length
    except ValueError:  # UnicodeDecodeError too
        return None
    return records if records.keys() <= _PAX_KEEPS else None


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _cut(raw: bytes) -> bytes:
    """A header field up to its first NUL."""
    return raw.split(b"\0", 1)[0]


def _tar_members(tar: tarfile.TarFile) -> Iterator[tarfile.TarInfo]:
    """``tar``'s members, read lazily: each member's data is read or seeked over before the next header."""
    for member in tar:
        # tarfile keeps every header it reads (in `members`, which typeshed leaves out); a shard may hold 100k samples
        tar.members = []  # type: ignore[attr-defined]
        yield member


def _sample_members(members: Iterable[Header | tarfile.TarInfo]) -> Iterator[tuple[Any, str, str]]:
    """(member, sample key, extension) of the regular files."""
    for member in members:
        key, extension = key_and_extension(member.name)
        if member.isreg() and key is not None and extension is not None:
            yield member, key, extension


@dataclass(frozen=True)
class Scan:
    """A shard read whole: its size and sha256, and its sample count or why the tar is unreadable."""

    bytes: int
    sha256: str
    samples: int | None
    problem: str | None


def scan(location: str) -> Scan:
    """Read the shard at ``location`` once, front to back; DataError (from source) if it cannot be read."""
    file, _ = open_shard(location)
    with file:
        hashing = _Hashing(file)
        try:
            # a stream ("r|") is only read; typeshed asks any fileobj for write, seek and close too
            with tarfile.open(fileobj=hashing, mode="r|", bufsize=1 << 20) as tar:  # type: ignore[call-overload]
                keys = (k for _, k, _ in _sample_members(_tar_members(tar)))
                samples, problem = sum(1 for _ in itertools.groupby(keys)), None
        except _READ_ERRORS as exc:
            samples, problem = None, f"unreadable tar: {exc}"
        while hashing.read(1 << 20):  # the padding after the end-of-archive blocks, or what a bad header hid
            pass
    return Scan(hashing.bytes, hashing.sha256.hexdigest(), samples, problem)


class _Hashing:
    """A file read through, hashed and counted on the way."""

    def __init__(self, file: BinaryIO):
        self._file = file
        self.sha256 = hashlib.sha256()
        self.bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self.sha256.update(data)
        self.bytes += len(data)
        return data
