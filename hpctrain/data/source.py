"""Opening a shard's bytes wherever its index says they are: the one module that knows shard locations.

A location is a local path, ``pipe:<shell command>`` (webdataset's convention: the command writes the
tar to stdout) or an ``http://`` / ``https://`` URL. `open_shard` gives a file read from byte 0 that
the tar reader moves forward through, seeking over the data of samples it does not want:

- a local file seeks: skipping samples costs their tar headers only;
- http(s) skips more than ``RANGE_GAP`` bytes with a new request for ``Range: bytes=N-`` (a 206
  answer), and reads through shorter gaps, which cost about what a new request does. A server that
  ignores ranges (answers 200) is read through, like a pipe;
- ``pipe:`` cannot seek: skipped bytes are read and discarded, so starting at sample k of a pipe
  shard (on resume, or where the epoch's plan splits a shard between two readers) reads the shard
  up to that sample: O(position within the shard), at most the one shard.

A source that cannot give its bytes (a missing file, an HTTP error status, a connection lost, a pipe
command exiting non-zero) raises DataError naming the location and the cause. That says nothing about
the data, so it stops the loader rather than quarantining the shard: the job fails, and a requeue or
a fixed index retries it. A shard whose bytes arrive but are wrong is tarshard's ShardCorrupt.
"""

from __future__ import annotations

import io
import os
import subprocess
import tempfile
from typing import TYPE_CHECKING, BinaryIO

from hpctrain.errors import DataError

if TYPE_CHECKING:
    from http.client import HTTPResponse

    from typing_extensions import Buffer

PIPE = "pipe:"
HTTP = ("http://", "https://")
RANGE_GAP = 1 << 20  # reading 1 MiB at 100 MB/s takes about as long as a request's round trip to a store
TIMEOUT_S = 60.0
_BUFFER = 64 << 10  # the most read ahead of a header before a seek that drops it


def is_url(location: str) -> bool:
    return location.startswith((PIPE, *HTTP))


def seekable(location: str) -> bool:
    """Whether starting mid-shard skips bytes without reading them (not for ``pipe:``)."""
    return not location.startswith(PIPE)


def open_shard(location: str) -> tuple[BinaryIO, int | None]:
    """``location``'s bytes from byte 0, and their size where the source tells it before they are read
    (not a pipe's). DataError naming ``location`` when the source cannot give them."""
    if location.startswith(PIPE):
        stream: _Stream = _Pipe(location)
    elif location.startswith(HTTP):
        stream = _Http(location)
    else:
        try:
            fh = open(location, "rb")
        except OSError as exc:
            raise DataError(f"{location}: {exc.strerror or exc}") from None
        # read front to back: twice the readahead window (on a virtual disk, more requests in flight)
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fh, os.fstat(fh.fileno()).st_size
    return io.BufferedReader(stream, _BUFFER), stream.size


class _Stream(io.RawIOBase):
    """Bytes read front to back. Seeking forward reads and discards, unless ``_jump`` can do better."""

    def __init__(self, location: str):
        self.location = location
        self.size: int | None = None
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True  # forward at least: the tar reader seeks over the samples it skips

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer: Buffer) -> int:
        n = self._readinto(buffer)
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise io.UnsupportedOperation(f"{self.location}: cannot seek from the end")
        target = offset + (self._pos if whence == io.SEEK_CUR else 0)
        if target != self._pos and not self._jump(target):
            if target < self._pos:
                raise io.UnsupportedOperation(f"{self.location}: cannot seek back")
            self._discard(target - self._pos)
        return self._pos

    def _discard(self, n: int) -> None:
        scratch = memoryview(bytearray(min(n, 1 << 20)))
        while n > 0 and (got := self.readinto(scratch[:n])):
            n -= got

    def _jump(self, target: int) -> bool:
        """Move to ``target`` without reading up to it, if that is possible and cheaper."""
        return False

    def _readinto(self, buffer: Buffer) -> int:
        raise NotImplementedError


class _Pipe(_Stream):
    """A shell command's stdout; its exit status is checked when the output ends."""

    def __init__(self, location: str):
        super().__init__(location)
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            location.removeprefix(PIPE),
            shell=True,
            bufsize=0,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )

    def _readinto(self, buffer: Buffer) -> int:
        assert isinstance(self._proc.stdout, io.FileIO)  # bufsize=0: unbuffered
        n = self._proc.stdout.readinto(buffer)
        if not n and (status := self._proc.wait()):
            self._stderr.seek(0)
            said = self._stderr.read().decode(errors="replace").strip().splitlines()
            cause = f"exit status {status}" if status > 0 else f"killed by signal {-status}"
            raise DataError(f"{self.location}: {cause}" + (f": {said[-1]}" if said else ""))
        return n or 0

    def close(self) -> None:
        if not self.closed:
            assert self._proc.stdout is not None
            self._proc.stdout.close()
            if self._proc.poll() is None:  # stopped early: the rest of the shard is not wanted
                self._proc.kill()
            self._proc.wait()
            self._stderr.close()
        super().close()


class _Http(_Stream):
    """An http(s) URL, fetched with urllib (the standard library; imported on first use)."""

    def __init__(self, location: str):
        super().__init__(location)
        self._ranges = True  # until the server shows it ignores them
        self._response: HTTPResponse | None = None
        self._request(0)

    def _request(self, start: int) -> None:
        """Continue from byte ``start`` with a new request."""
        from http.client import HTTPException
        from urllib.error import HTTPError, URLError
        from urllib.request import Request, urlopen

        self._close_response()
        self._pos = start
        try:
            response = urlopen(Request(self.location, headers={"Range": f"bytes={start}-"}), timeout=TIMEOUT_S)
        except HTTPError as exc:
            exc.close()
            if exc.code == 416:  # at or past the end
                return
            raise DataError(f"{self.location}: HTTP {exc.code} {exc.reason}") from None
        except (URLError, OSError, HTTPException) as exc:
            raise DataError(f"{self.location}: {getattr(exc, 'reason', exc)}") from None
        self._response = response
        if response.status == 206:
            total = response.headers.get("Content-Range", "").rpartition("/")[2]
            self.size = int(total) if total.isdigit() else self.size
            return
        self._ranges = False  # the body is the whole shard
        length = response.headers.get("Content-Length")
        self.size = int(length) if length and length.isdigit() else self.size
        self._pos = 0
        self._discard(start)

    def _jump(self, target: int) -> bool:
        if target >= self._pos and (not self._ranges or target - self._pos <= RANGE_GAP):
            return False
        self._request(target)
        return True

    def _readinto(self, buffer: Buffer) -> int:
        from http.client import HTTPException

        if self._response is None:
            return 0
        try:
            return self._response.readinto(buffer)
        except (OSError, HTTPException) as exc:
            raise DataError(f"{self.location}: connection lost at byte {self._pos}: {exc}") from None

    def _close_response(self) -> None:
        if self._response is not None:
            self._response.close()
            self._response = None

    def close(self) -> None:
        self._close_response()
        super().close()
