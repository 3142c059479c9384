"""Issue 56.16: a failed SQLite call on the ledger is worded by what it means; only damage inside the file says to
restore it from a copy (restoring after a lock, a full disk or a failed read would lose good records)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from helpers.bad_input import invoke

from hpctrain.ledger import Ledger
from hpctrain.ledger.failures import describe


def raised(call) -> sqlite3.Error:
    with pytest.raises(sqlite3.Error) as info:
        call()
    return info.value


def locked(path: Path) -> sqlite3.Error:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        return raised(lambda: sqlite3.connect(path, timeout=0).execute("CREATE TABLE t (x)"))
    finally:
        holder.close()


def read_only(path: Path) -> sqlite3.Error:
    sqlite3.connect(path).execute("CREATE TABLE s (x)").connection.close()
    return raised(lambda: sqlite3.connect(f"file:{path}?mode=ro", uri=True).execute("CREATE TABLE t (x)"))


def full(path: Path) -> sqlite3.Error:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA max_page_count = 2")
    return raised(lambda: [conn.execute(f"CREATE TABLE t{i} (x)") for i in range(5)])


def cannot_open(path: Path) -> sqlite3.Error:
    return raised(lambda: sqlite3.connect(path.parent / "missing" / "ledger.db"))


def malformed(path: Path) -> sqlite3.Error:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 50)
    conn.commit()
    (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 't'").fetchone()
    conn.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * 4096] = 0x00  # not a b-tree page type
    path.write_bytes(bytes(data))
    return raised(lambda: sqlite3.connect(path).execute("SELECT count(*) FROM t").fetchone())


def not_a_database(path: Path) -> sqlite3.Error:
    path.write_bytes(b"x" * 4096)
    return raised(lambda: sqlite3.connect(path).execute("SELECT * FROM sqlite_master").fetchone())


def io_error(path: Path) -> sqlite3.Error:
    """As Python 3.11 raises it (SQLite's EIO cannot be made here), and as 3.10 does: the text alone."""
    exc = sqlite3.OperationalError("disk I/O error")
    exc.sqlite_errorcode, exc.sqlite_errorname = 266, "SQLITE_IOERR_READ"  # type: ignore[attr-defined]
    return exc


@pytest.mark.parametrize("make, says", [
    (locked, "the ledger stayed locked by another process for longer than hpctrain waits (database is locked): "),
    (read_only, "the ledger cannot be written (attempt to write a readonly database): "),
    (full, "the disk holding the ledger, or SQLite's temporary files, is full (database or disk is full): "),
    (cannot_open, "SQLite cannot open the ledger's files (unable to open database file): "),
    (io_error, "reading or writing the ledger's disk failed (disk I/O error): "),
    (lambda p: sqlite3.OperationalError("disk I/O error"), "reading or writing the ledger's disk failed ("),
    (malformed, "the ledger is damaged (database disk image is malformed); restore it from a copy"),
    (not_a_database, "the ledger is damaged (file is not a database); restore it from a copy"),
])
def test_each_failure_gets_its_own_line(tmp_path, make, says):
    line = describe(make(tmp_path / "some.db"))  # not ledger.db: the test's own ledger (conftest)
    assert line.startswith(says) and "\n" not in line
    assert line.startswith("the ledger is damaged") == (make in (malformed, not_a_database))


def test_the_cli_says_a_locked_ledger_is_locked_not_damaged(tmp_path, monkeypatch):
    path = tmp_path / "mine.db"
    with Ledger(path):
        pass
    exc = locked(path)

    def vacuum(ledger):
        raise exc

    monkeypatch.setattr("hpctrain.ledger.archive.vacuum", vacuum)
    result = invoke("ledger", "vacuum", env={"HPCTRAIN_LEDGER": str(path)})
    assert result.exit_code == 2
    assert result.stderr == ("hpctrain: error: the ledger stayed locked by another process for longer than hpctrain "
                             "waits (database is locked): run this again once the other hpctrain command (or cron "
                             "tick) is done\n")
