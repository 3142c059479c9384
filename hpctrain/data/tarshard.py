"""Reading one WebDataset tar shard front to back, skipping the data of samples not wanted.

webdataset's tariterators stream every byte of a shard, so resuming mid-shard, or starting a
shard split between two readers at sample k, would read the whole prefix. Here the tar is opened
seekable: the samples before the wanted ones cost their headers only (where the source can seek,
see source), and the rest is one sequential read. Samples are grouped by key as webdataset does
(``key_and_extension``). `scan` reads a whole shard once, for indexing and verifying.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import tarfile
from dataclasses import dataclass
from typing import BinaryIO, Iterator, Sequence

from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.data.source import open_shard

# webdataset's own rule (tariterators.base_plus_ext), kept here: importing webdataset imports torch, and
# `hpctrain data verify` runs on login nodes; tests/test_data_loader.py checks the two agree.
_KEY_EXT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def key_and_extension(name: str) -> tuple[str | None, str | None]:
    """'dir/000001.seg.npy' -> ('dir/000001', 'seg.npy'): a member's sample key and its field."""
    m = _KEY_EXT.match(name)
    return (m[1], m[2]) if m else (None, None)


class ShardCorrupt(Exception):
    """The shard cannot be read as its index describes it (the message is the reason)."""


RawSample = dict[str, bytes | str]
_READ_ERRORS = (OSError, tarfile.TarError, EOFError)


class Shard:
    """An open shard, checked against its index's size where the source tells it up front (not ``pipe:``).
    Use as a context manager. DataError (from source) when the shard's bytes cannot be had at all."""

    def __init__(self, index: ShardIndex, info: ShardInfo):
        self.info = info
        self._file, size = open_shard(index.location(info))
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

    def __enter__(self) -> "Shard":
        return self

    def __exit__(self, *exc: object) -> None:
        self._tar.close()
        self._file.close()

    def samples(self, wanted: Sequence[int]) -> Iterator[tuple[int, RawSample]]:
        """(i, sample) for the ascending sample numbers ``wanted``, as {"__key__": key, extension: bytes}."""
        targets = iter(wanted)
        target = next(targets, None)
        i, key, sample = -1, None, {}
        try:
            for member, member_key, extension in _sample_members(self._tar):
                if member_key != key:
                    if i == target:
                        yield i, sample
                        target = next(targets, None)
                    if target is None:
                        return
                    i, key, sample = i + 1, member_key, {"__key__": member_key}
                if i == target:
                    fh = self._tar.extractfile(member)
                    assert fh is not None  # a regular file
                    sample[extension.lower()] = fh.read()
        except _READ_ERRORS as exc:
            raise ShardCorrupt(f"unreadable tar after {i} samples: {exc}") from None
        if i == target:
            yield i, sample
            target = next(targets, None)
        if target is not None:
            raise ShardCorrupt(f"{i + 1} samples, index says {self.info.samples}")

    def read_in_order(self, order: Sequence[int]) -> Iterator[tuple[int, RawSample]]:
        """(i, sample) for i in ``order``, reading the file front to back and holding only samples read ahead."""
        ahead = self.samples(sorted(order))
        held: dict[int, RawSample] = {}
        for i in order:
            while i not in held:
                j, sample = next(ahead)
                held[j] = sample
            yield i, held.pop(i)


def _sample_members(tar: tarfile.TarFile) -> Iterator[tuple[tarfile.TarInfo, str, str]]:
    """(member, sample key, extension) of the regular files, read lazily: each member's data is read or
    seeked over before the next header."""
    for member in tar:
        key, extension = key_and_extension(member.name)
        tar.members = []  # tarfile keeps every header it reads; a shard may hold 100k samples
        if member.isreg() and key is not None:
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
            with tarfile.open(fileobj=hashing, mode="r|", bufsize=1 << 20) as tar:
                samples, problem = sum(1 for _ in itertools.groupby(k for _, k, _ in _sample_members(tar))), None
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
