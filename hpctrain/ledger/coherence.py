"""Whether a file system keeps a file coherent between hosts, as SQLite's rollback journal needs: the probe.

SQLite on a shared file system needs two things of it: POSIX locks that hold across hosts, and reads that see,
under such a lock, every write another host made before releasing it. Whether the second holds depends on the
clients' caches (GlusterFS's write-behind, io-cache and open-behind, NFS's attribute cache), set by the site on
servers and mounts and invisible in the mount table. So it is measured. Two participants, this process and a peer
on another host (a compute node's one-task job, or a second login host), take turns on a probe file beside the
ledger: each turn opens it, locks it as SQLite does, reads a counter and a page that must match it, writes both
incremented, and releases it; then the participant tells the other, over the pipe between them (not through the
file system), the count it wrote. The other's next turn must read exactly that count and its page: anything
older is a stale read. Each participant's findings are a line of JSON.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import select
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

PAGE = 4096
PREFIX = ".hpctrain-probe-"
ROUNDS = 100  # turns of each participant
TURN_S = 30.0  # the other's turn takes at most this (its start excepted)
STALE_S = 2 * 3600.0  # a probe file this old was left by a probe that was killed (a probe takes seconds)


def _mount_namespace() -> str:
    """This process's mount namespace: two participants on one host name in one namespace share one client."""
    try:
        return os.readlink("/proc/self/ns/mnt")
    except OSError:
        return ""


@dataclass
class Findings:
    """What one participant saw: its turns, the stale reads it caught (the first few described), and the error
    that ended its part early, if one did."""

    role: str
    host: str = field(default_factory=socket.gethostname)
    namespace: str = field(default_factory=_mount_namespace)
    turns: int = 0
    stale: int = 0
    examples: list[str] = field(default_factory=list)
    error: str | None = None

    def stale_read(self, what: str) -> None:
        self.stale += 1
        if len(self.examples) < 2:
            self.examples.append(what)

    def line(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def parse(cls, text: str) -> Findings:
        return cls(**json.loads(text))


def page_for(count: int) -> bytes:
    """The page that must be read with ``count``: a different one for each count."""
    return hashlib.sha256(str(count).encode()).digest() * (PAGE // 32)


def _record(count: int) -> bytes:
    return json.dumps({"count": count}).encode().ljust(PAGE, b" ") + page_for(count)


def probe_path(folder: Path) -> Path:
    """A new probe file's path in ``folder``; the files there of probes killed over ``STALE_S`` ago removed."""
    for old in folder.glob(f"{PREFIX}*"):
        with contextlib.suppress(OSError):
            if time.time() - old.lstat().st_mtime > STALE_S:
                old.unlink()
    return folder / f"{PREFIX}{os.getpid()}-{time.time_ns()}"


def create(path: Path) -> None:
    """The probe file at count 0 (O_EXCL: never another file's)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.pwrite(fd, _record(0), 0)
        os.fsync(fd)
    finally:
        os.close(fd)


def _lock(fd: int, deadline: float) -> None:
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError("the probe file stayed locked by the other participant") from None
            time.sleep(0.002)


def turn(path: Path, expect: int, findings: Findings) -> int:
    """One turn: open and lock the file (a POSIX lock, as SQLite takes, on a fresh descriptor, as each command
    opens the ledger), read it, note a read that is not ``expect`` and its page, write ``expect + 1``."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        _lock(fd, time.monotonic() + TURN_S)
        data = os.pread(fd, 2 * PAGE, 0)
        try:
            count = int(json.loads(data[:PAGE])["count"])
        except (ValueError, KeyError, TypeError):
            findings.stale_read(f"a record that is not one ({len(data)} bytes) where count {expect} was written")
        else:
            if count != expect:
                findings.stale_read(f"count {count} read where {expect} was written")
            elif data[PAGE:] != page_for(count):
                findings.stale_read(f"count {count} read with another count's page")
        os.pwrite(fd, _record(expect + 1), 0)
        os.fsync(fd)
        findings.turns += 1
        return expect + 1
    finally:
        with contextlib.suppress(OSError):
            fcntl.lockf(fd, fcntl.LOCK_UN)
        os.close(fd)


def receive(stream: IO[str], timeout_s: float) -> int | None:
    """The next count the other participant says it wrote; None when it says it is done or has gone."""
    if not select.select([stream], [], [], timeout_s)[0]:
        raise TimeoutError(f"the other participant said nothing for {timeout_s:g} s")
    line = stream.readline().strip()
    return int(line) if line.isdigit() else None


def lead(path: Path, send: Callable[[str], None], stream: IO[str], first_s: float, rounds: int = ROUNDS) -> Findings:
    """The leader's part, the probe file made at count 0: ``rounds`` turns, each answered by the peer's
    (``first_s`` for its first answer: the peer may still be starting); then it tells the peer it is done."""
    findings, count = Findings("leader"), 0
    try:
        for n in range(rounds):
            count = turn(path, count, findings)
            send(f"{count}\n")
            answer = receive(stream, first_s if n == 0 else TURN_S)
            if answer != count + 1:
                raise RuntimeError(f"the peer answered {answer} to {count}")
            count = answer
        send("done\n")
    except (OSError, TimeoutError, RuntimeError) as exc:
        findings.error = str(exc)
    return findings


def follow(path: Path, stream: IO[str], out: IO[str]) -> Findings:
    """The peer's part: a turn after each of the leader's, until it is done."""
    findings = Findings("peer")
    try:
        while (count := receive(stream, TURN_S)) is not None:
            out.write(f"{turn(path, count, findings)}\n")
            out.flush()
    except (OSError, TimeoutError) as exc:
        findings.error = str(exc)
    return findings


def verdict(leader: Findings, peer: Findings) -> str | None:
    """What the findings say is wrong, in words; None when every read under the lock was fresh."""
    for who in (leader, peer):
        if who.error:
            return f"the {who.role} stopped: {who.error}"
    stale = [
        f"the {w.role} read stale data in {w.stale} of {w.turns} turns (such as {'; '.join(w.examples)})"
        for w in (leader, peer)
        if w.stale
    ]
    return "; ".join(stale) or None


def main() -> int:
    """The peer, on another host: ``python -m hpctrain.ledger.coherence PROBE_FILE``, the leader's counts on
    stdin, its own on stdout, its findings on stdout's last line."""
    findings = follow(Path(sys.argv[1]), sys.stdin, sys.stdout)
    print(findings.line(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
