"""The ledger: one SQLite file that every part of hpctrain writes through (WAL on a local disk, its rollback
journal on a shared file system: `hpctrain.ledger.storage`).

Each table family has its typed API, the only place its SQL lives: `ledger.jobs` (jobs and array tasks),
`ledger.attempts`, `ledger.sweeps` (sweeps and trials), `ledger.metrics`, `ledger.checkpoints`,
`ledger.segments`, `ledger.usage` (settled runs' GPU-hours), `ledger.gpus` (how busy GPUs were), `ledger.events`,
`ledger.evaluations` (of checkpoints), `ledger.registry` (models, versions, aliases), `ledger.exports` (what
trackers were sent), `ledger.site_cache` and `ledger.ingested` (journal records folded in). Rows come and go as
the dicts of `hpctrain.ledger.rows`; the generic row access they are built on (`hpctrain.ledger.table`) is the
ledger's own.

Only login-node processes open it; compute nodes write manifests that `reconcile` folds in.
Writes run in BEGIN IMMEDIATE transactions so concurrent writers queue on the busy timeout
instead of failing with "database is locked" when a read transaction tries to upgrade.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from hpctrain.errors import LedgerError
from hpctrain.ledger.attempts import Attempts
from hpctrain.ledger.checkpoints import Checkpoints
from hpctrain.ledger.evaluations import Evaluations
from hpctrain.ledger.events import Events
from hpctrain.ledger.exports import TrackerExports
from hpctrain.ledger.failures import transient
from hpctrain.ledger.gpus import Gpus
from hpctrain.ledger.ingested import Ingested
from hpctrain.ledger.jobs import Jobs
from hpctrain.ledger.metrics import Metrics
from hpctrain.ledger.registry import Registry
from hpctrain.ledger.schema import MIGRATIONS, SCHEMA_VERSION
from hpctrain.ledger.segments import Segments
from hpctrain.ledger.site_cache import SiteCache
from hpctrain.ledger.sqlite import sqlite_utils
from hpctrain.ledger.storage import storage_for
from hpctrain.ledger.sweeps import Sweeps
from hpctrain.ledger.usage import RunUsage

BUSY_TIMEOUT_S = 60.0
# How long a network home's server may be away (restarting, failing over) before a command says so; each retry
# is a stat or an open, so pausing long between them costs nothing.
AWAY_S, AWAY_PAUSE_S = 60.0, 0.5
# Rows of each index that ANALYZE samples: planner statistics in milliseconds on a ledger of any size.
ANALYSIS_LIMIT = 1000
SQLITE_HEADER = b"SQLite format 3\x00"
# The ledger files (device, inode) this process has open, with the Ledgers (their ids) open on each. Such a file is
# never opened by a descriptor of its own again: closing any descriptor of a file drops every POSIX lock the process
# holds on it, SQLite's included, and a peer closing its connection then takes itself for the file's last user and
# deletes the WAL under the connections still open (https://sqlite.org/howtocorrupt.html, 2.2). A process may well
# hold two ledgers on one file: the executor's job watcher keeps its own for the process's life.
_OPEN_HERE: defaultdict[tuple[int, int] | None, set[int]] = defaultdict(set)
_OPEN_LOCK = threading.Lock()
T = TypeVar("T")


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _create_or_check(path: Path, mode: int) -> None:
    """Create the file with ``mode`` (umask may only narrow it), or check that the one there is a database: SQLite
    would take a short file for an empty database and write a new one over it."""
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, mode))
    with open(path, "rb") as fh:
        head = fh.read(len(SQLITE_HEADER))
    if head and head != SQLITE_HEADER:
        raise LedgerError(f"{path}: cannot open ledger: file is not a database")


def _leave_wal(path: Path) -> None:
    """A ledger in WAL mode (made on a local disk) now where it must not be: leave WAL under an exclusive lock,
    with which SQLite keeps the WAL index in this process's memory. On a mount where the -shm file cannot be
    mapped (GlusterFS with direct-io: ENODEV) a plain open fails as a "disk I/O error". Where another process
    holds it, it stays as it is (`Ledger._set_journal_mode` then says so)."""
    with open(path, "rb") as fh:
        head = fh.read(20)
    if len(head) < 20 or head[18] != 2:  # the file format's read version: 2 is WAL
        return
    conn = sqlite3.connect(path, timeout=1.0)
    try:
        conn.execute("PRAGMA locking_mode=EXCLUSIVE")
        conn.execute("PRAGMA journal_mode=DELETE")
    except sqlite3.OperationalError:
        pass
    finally:
        conn.close()


def _until_back(path: Path, away_s: float, op: Callable[[], T]) -> T:
    """``op()``, tried again while it fails in a way the file system may recover from, for up to ``away_s``; then
    one line saying so."""
    deadline = time.monotonic() + away_s
    while True:
        try:
            return op()
        except (sqlite3.Error, OSError) as exc:
            if not transient(exc):
                raise
            if time.monotonic() >= deadline:
                why = exc.strerror if isinstance(exc, OSError) else str(exc)
                raise LedgerError(
                    f"{path}: the file system holding the ledger failed for {away_s:.0f} s ({why}): check that it is "
                    "mounted and its server reachable, then run this again; the ledger itself is not damaged"
                ) from None
        time.sleep(AWAY_PAUSE_S)


class Ledger:
    """Open (creating and migrating as needed) the ledger at ``path``."""

    def __init__(
        self, path: str | Path, busy_timeout_s: float = BUSY_TIMEOUT_S, mode: int = 0o600, away_s: float = AWAY_S
    ):
        """A new ledger file gets ``mode`` (owner-only by default: jobs, specs and lineage are private);
        SQLite gives its -wal and -shm files the same. A file system that does not answer (a network home's server
        restarting) is waited for up to ``away_s``, here and at the start of each write."""
        self.path = Path(path).expanduser()
        self._reading = False  # a read transaction of `reading` is open
        self._lost = False  # the connection was closed after the file system failed under it: a new one is due
        self._busy_timeout_s, self._away_s = busy_timeout_s, away_s
        _until_back(self.path, away_s, lambda: self._open(mode))
        self.jobs, self.attempts, self.sweeps = Jobs(self), Attempts(self), Sweeps(self)
        self.metrics, self.checkpoints, self.segments = Metrics(self), Checkpoints(self), Segments(self)
        self.usage, self.events, self.gpus = RunUsage(self), Events(self), Gpus(self)
        self.site_cache, self.ingested = SiteCache(self), Ingested(self)
        self.evaluations, self.registry, self.exports = Evaluations(self), Registry(self), TrackerExports(self)

    def _open(self, mode: int) -> None:
        """Open (creating and migrating as needed); an error the file system may recover from is raised as it
        came, to be tried again (`_until_back`), any other as a LedgerError."""
        self.storage = storage_for(self.path)  # before anything is written: a refused place gets no file
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _OPEN_LOCK:
                if not _OPEN_HERE.get(_file_id(self.path)):
                    _create_or_check(self.path, mode)
                    if self.storage.journal_mode != "wal":
                        _leave_wal(self.path)
                conn = self._connect(foreign_keys=False)  # off: a migration may rebuild a table others reference
                self._file = _file_id(self.path)
                _OPEN_HERE[self._file].add(id(self))
            self.db = sqlite_utils.Database(conn)
            try:
                self._set_journal_mode()
                self._migrate()
                conn.execute("PRAGMA foreign_keys=ON")
                if not self.db.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone():
                    self.analyze()  # a ledger from before v15, or new: what the planner knows of it is made once
            except BaseException:
                self._release()
                raise
        except sqlite3.DatabaseError as exc:
            if transient(exc):
                raise
            raise LedgerError(f"{self.path}: cannot open ledger: {exc}") from None
        except OSError as exc:
            if transient(exc):
                raise
            raise LedgerError(f"{self.path}: cannot create ledger: {exc.strerror}") from None

    def _connect(self, foreign_keys: bool = True) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s)
        conn.execute(f"PRAGMA synchronous={self.storage.synchronous}")
        conn.execute(f"PRAGMA analysis_limit={ANALYSIS_LIMIT}")
        if foreign_keys:
            conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def _begin_write(self) -> None:
        """BEGIN IMMEDIATE, waiting up to ``away_s`` for a file system that failed. A connection whose file failed is
        replaced when it is this process's only one on the file: its descriptor may stay dead after the server is
        back (Gluster reopens no file that held locks), and closing it cannot drop another one's locks."""

        def begin() -> None:
            self._revive()
            try:
                self.db.conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if transient(exc) and _OPEN_HERE.get(self._file) == {id(self)}:
                    self.db.close()
                    self._lost = True
                raise

        _until_back(self.path, self._away_s, begin)

    def _revive(self) -> None:
        """A new connection where the file system failed under the old one (`_begin_write`)."""
        if self._lost:
            self.path.stat()  # while the server is away: its error, which says so (SQLite's would not)
            self.db = sqlite_utils.Database(self._connect())
            self._lost = False

    def _set_journal_mode(self) -> None:
        """The mode `storage` chose. SQLite keeps the old one while another process has the file open: a local
        ledger then goes on in its rollback journal until the next open; a WAL ledger now on a shared file system
        must not go on (two hosts would each keep its index)."""
        want = self.storage.journal_mode
        have = self.db.execute("PRAGMA journal_mode").fetchone()[0].lower()
        if have != want:
            with contextlib.suppress(sqlite3.OperationalError):  # "database is locked": the old mode stays
                have = self.db.execute(f"PRAGMA journal_mode={want}").fetchone()[0].lower()
        if have == "wal" and want != "wal":
            raise LedgerError(
                f"{self.path}: the ledger is in WAL mode and open in another process; on {self.storage.fstype} it "
                "must leave WAL: end the other hpctrain commands (and cron ticks) using it, then run this again"
            )

    def close(self) -> None:
        """Close, first refreshing the statistics of tables that grew (SQLite's advice for each connection); not
        when another process holds the write lock: the next close does it."""
        conn = self.db.conn
        try:
            if not self._lost and conn.total_changes:
                conn.execute("PRAGMA busy_timeout = 0")
                conn.execute("PRAGMA optimize")
        except sqlite3.OperationalError:
            pass
        finally:
            self._release()

    def _release(self) -> None:
        self.db.close()
        with _OPEN_LOCK:
            _OPEN_HERE[self._file].discard(id(self))
            if not _OPEN_HERE[self._file]:
                del _OPEN_HERE[self._file]

    def analyze(self) -> None:
        """Fresh planner statistics of every table (sampled: `ANALYSIS_LIMIT`)."""
        with self.transaction():
            self.db.execute("ANALYZE")

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        return self.db.execute("PRAGMA user_version").fetchone()[0]

    def _migrate(self) -> None:
        if self.schema_version == SCHEMA_VERSION:
            return
        with self.transaction():  # re-read inside the lock: another process may have migrated
            current = self.schema_version
            if current > SCHEMA_VERSION:
                raise LedgerError(
                    f"{self.path}: ledger schema v{current} is newer than this hpctrain (v{SCHEMA_VERSION}): upgrade hpctrain"
                )
            if current:  # an upgrade rewrites what the new schema sums up: minutes on a ledger of years
                print(f"hpctrain: upgrading the ledger {self.path} to schema v{SCHEMA_VERSION}", file=sys.stderr)
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for step in MIGRATIONS[version - 1]:
                    if isinstance(step, str):
                        self.db.execute(step)
                    else:
                        step(self.db.conn)
                self.db.execute(f"PRAGMA user_version = {version}")
            self.db.execute("ANALYZE")  # new indexes, new tables

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """A write transaction (BEGIN IMMEDIATE); nested calls become savepoints. Within `reading` the read
        transaction ends first and begins again after: a read never upgrades to a write, which two processes doing
        it at once would deadlock on (SQLite answers one of them "database is locked" without waiting)."""
        if not self._lost and self.db.conn.in_transaction and not self._reading:
            with self.db.atomic():
                yield self.db
            return
        resume_reading = self._end_reading()
        try:
            self._begin_write()
            conn = self.db.conn  # a new one where the file system failed under the old
            try:
                yield self.db
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        finally:
            if resume_reading and not self._lost:
                self.db.conn.execute("BEGIN")
                self._reading = True

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """Many reads in one read transaction: on a shared file system each statement outside a transaction takes
        and drops the file's lock and checks the file again, each a round trip to the server (hundreds in a
        `status`), and here all of them share one. Inside another transaction it adds nothing."""
        if not self._lost and self.db.conn.in_transaction:
            yield
            return
        self._revive()
        self.db.conn.execute("BEGIN")  # deferred: the first read takes the shared lock
        self._reading = True
        try:
            yield
        finally:
            self._end_reading()

    def _end_reading(self) -> bool:
        """End the read transaction of `reading`, if one is open; whether one was."""
        if not self._reading:
            return False
        self._reading = False
        if self.db.conn.in_transaction:
            self.db.conn.execute("COMMIT")  # nothing was written: this only drops the shared lock
        return True

    def event(self, kind: str, message: str = "", job_id: int | None = None, **data: Any) -> int:
        """Append to the event log (submissions, choices, requeues, quarantines, ...): `Events.add` with the data
        as keywords."""
        return self.events.add(kind, message, job_id, data)
