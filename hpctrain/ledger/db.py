"""The ledger: one local SQLite file (WAL) that every part of hpctrain writes through.

Each table family has its typed API, the only place its SQL lives: `ledger.jobs` (jobs and array tasks),
`ledger.attempts`, `ledger.sweeps` (sweeps and trials), `ledger.metrics`, `ledger.checkpoints`,
`ledger.segments`, `ledger.usage` (settled runs' GPU-hours); events
and the generic row access below serve the rest.

Only login-node processes open it; compute nodes write manifests that `reconcile` folds in.
Writes run in BEGIN IMMEDIATE transactions so concurrent writers queue on the busy timeout
instead of failing with "database is locked" when a read transaction tries to upgrade.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlite_utils

from hpctrain.errors import LedgerError
from hpctrain.ledger.attempts import Attempts
from hpctrain.ledger.checkpoints import Checkpoints
from hpctrain.ledger.jobs import Jobs
from hpctrain.ledger.metrics import Metrics
from hpctrain.ledger.schema import MIGRATIONS, SCHEMA_VERSION
from hpctrain.ledger.segments import Segments
from hpctrain.ledger.sweeps import Sweeps
from hpctrain.ledger.usage import RunUsage

BUSY_TIMEOUT_S = 60.0
SQLITE_HEADER = b"SQLite format 3\x00"


class Ledger:
    """Open (creating and migrating as needed) the ledger at ``path``."""

    def __init__(self, path: str | Path, busy_timeout_s: float = BUSY_TIMEOUT_S, mode: int = 0o600):
        """A new ledger file gets ``mode`` (owner-only by default: jobs, specs and lineage are private);
        SQLite gives its -wal and -shm files the same."""
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, mode))  # umask may only narrow it
            with open(self.path, "rb") as fh:
                head = fh.read(len(SQLITE_HEADER))
            # SQLite would take a short file for an empty database and write a new one over it.
            if head and head != SQLITE_HEADER:
                raise LedgerError(f"{self.path}: cannot open ledger: file is not a database")
            conn = sqlite3.connect(self.path, timeout=busy_timeout_s)
            self.db = sqlite_utils.Database(conn)
            self.db.enable_wal()
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._migrate()
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"{self.path}: cannot open ledger: {exc}") from None
        except OSError as exc:
            raise LedgerError(f"{self.path}: cannot create ledger: {exc.strerror}") from None
        self.jobs, self.attempts, self.sweeps = Jobs(self), Attempts(self), Sweeps(self)
        self.metrics, self.checkpoints, self.segments = Metrics(self), Checkpoints(self), Segments(self)
        self.usage = RunUsage(self)

    def close(self) -> None:
        self.db.close()

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
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version - 1]:
                    self.db.execute(statement)
                self.db.execute(f"PRAGMA user_version = {version}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite_utils.Database]:
        """A write transaction (BEGIN IMMEDIATE); nested calls become savepoints."""
        conn = self.db.conn
        if conn.in_transaction:
            with self.db.atomic():
                yield self.db
            return
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # The small write/read API everything else goes through.

    def insert(self, table: str, row: dict[str, Any]) -> int:
        """Insert one row; returns its rowid."""
        with self.transaction():
            return self.db.table(table).insert(_encode(row)).last_rowid

    def upsert(self, table: str, row: dict[str, Any], pk: str | tuple[str, ...]) -> None:
        with self.transaction():
            self.db.table(table).upsert(_encode(row), pk=pk)

    def update(self, table: str, pk: Any, fields: dict[str, Any]) -> None:
        with self.transaction():
            self.db.table(table).update(pk, _encode(fields))

    def rows(
        self, table: str, where: str | None = None, params: Any = None, order_by: str | None = None
    ) -> list[dict[str, Any]]:
        return list(self.db.table(table).rows_where(where, params, order_by=order_by))

    def get(self, table: str, pk: Any) -> dict[str, Any] | None:
        try:
            return self.db.table(table).get(pk)
        except sqlite_utils.db.NotFoundError:
            return None

    def events_of(self, job_id: int) -> list[dict[str, Any]]:
        return self.rows("events", "job_id = ?", [job_id], order_by="time")

    def last_event(self, job_id: int, kind: str) -> dict[str, Any] | None:
        """The job's latest event of ``kind``, its data decoded."""
        for row in self.db.table("events").rows_where(
            "job_id = ? AND kind = ?", [job_id, kind], order_by="time DESC", limit=1
        ):
            return {**row, "data": json.loads(row["data_json"] or "{}")}
        return None

    def event(self, kind: str, message: str = "", job_id: int | None = None, **data: Any) -> int:
        """Append to the event log (submissions, choices, requeues, quarantines, ...)."""
        return self.insert(
            "events",
            {"time": time.time(), "kind": kind, "job_id": job_id, "message": message, "data_json": data or None},
        )


def _encode(row: dict[str, Any]) -> dict[str, Any]:
    """Columns named *_json hold JSON; everything else is stored as given."""
    return {
        k: (
            json.dumps(v, sort_keys=True, default=str)
            if k.endswith("_json") and v is not None and not isinstance(v, str)
            else v
        )
        for k, v in row.items()
    }
