"""What a failed SQLite call on the ledger means, in one line a user can act on. Only damage inside the file
(SQLITE_CORRUPT, SQLITE_NOTADB) says to restore it from a copy: after a failed read or write of the disk, a lock
held too long, a file this user may not write or a full disk the file is as good as before, and a copy would
lose the records written since."""

from __future__ import annotations

import errno
import sqlite3

# SQLite's primary result codes (https://sqlite.org/rescode.html) by the text SQLite gives each: Python 3.10's
# exceptions carry only the text (3.11 adds sqlite_errorcode, an extended code whose low byte is the primary one).
_BUSY, _LOCKED, _READONLY, _IOERR, _CORRUPT, _FULL, _CANTOPEN, _NOTADB = 5, 6, 8, 10, 11, 13, 14, 26
_CODE_OF_TEXT = {
    "database is locked": _BUSY,
    "database table is locked": _LOCKED,
    "attempt to write a readonly database": _READONLY,
    "disk I/O error": _IOERR,
    "database disk image is malformed": _CORRUPT,
    "database or disk is full": _FULL,
    "unable to open database file": _CANTOPEN,
    "file is not a database": _NOTADB,
}
_DAMAGED = "the ledger is damaged ({}); restore it from a copy"
_BUSY_LINE = (
    "the ledger stayed locked by another process for longer than hpctrain waits ({}): run this again once the other "
    "hpctrain command (or cron tick) is done"
)
_LINES = {
    _CORRUPT: _DAMAGED,
    _NOTADB: _DAMAGED,
    _BUSY: _BUSY_LINE,
    _LOCKED: _BUSY_LINE,
    _IOERR: (
        "reading or writing the ledger's disk failed ({}): check the file system that holds it (mounted, reachable, "
        "healthy), then run this again; this is no damage in the ledger, do not restore it from a copy"
    ),
    _READONLY: "the ledger cannot be written ({}): this user may only read it or its folder, or the file system is "
    "mounted read-only",
    _FULL: "the disk holding the ledger, or SQLite's temporary files, is full ({}): free space there, then run this again",
    _CANTOPEN: (
        "SQLite cannot open the ledger's files ({}): check that its folder exists and that this user may write there "
        "(SQLite keeps -wal, -shm or -journal files beside the ledger)"
    ),
}


# What the OS answers while a network file system's server is away (restarting, unreachable): it may come back.
_AWAY = {errno.ENOTCONN, errno.ESTALE, errno.EIO, errno.ETIMEDOUT, errno.EHOSTDOWN, errno.EHOSTUNREACH}


def _primary(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is None:
        code = next((c for text, c in _CODE_OF_TEXT.items() if str(exc).startswith(text)), None)
    return code & 0xFF if code is not None else None


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` may pass if tried again: the file system under the ledger failed a read, a write or a lock
    (SQLite's I/O errors), or answered as while its server is away (the OS's errors above). Not SQLite's "unable to
    open": a folder this user may not write says the same, and waiting would not change it."""
    if isinstance(exc, sqlite3.Error):
        return _primary(exc) == _IOERR
    return isinstance(exc, OSError) and exc.errno in _AWAY


def describe(exc: sqlite3.Error) -> str:
    """The line that says what ``exc``, raised by SQLite on the ledger, means and what to do."""
    code = _primary(exc)
    line = _LINES.get(code) if code is not None else None
    if line is None:
        return f"SQLite failed on the ledger ({getattr(exc, 'sqlite_errorname', type(exc).__name__)}: {exc})"
    return line.format(exc)
