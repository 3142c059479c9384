"""The journal_ingested table: the journal records (by file name) already folded into the ledger, so that
`hpctrain.ledger.ingest` folds each exactly once; and journal_seen: each journal directory's mtime when it was last
read through, so that a refresh skips the directories nothing was written to since."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

from hpctrain.ledger.rows import IngestedRow
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class Ingested:
    """Rows of `journal_ingested`, keyed by (journal directory, record file name)."""

    def __init__(self, ledger: Ledger):
        self._ledger = ledger
        self._rows: Table[IngestedRow] = Table(ledger, "journal_ingested", ("journal", "name"))

    def names(self, journal: str) -> set[str]:
        """The records of ``journal`` folded in."""
        return {r["name"] for r in self._rows.rows("journal = ?", [journal])}

    def has(self, journal: str, name: str) -> bool:
        return self._rows.get((journal, name)) is not None

    def add(self, journal: str, name: str, kind: str) -> None:
        self._rows.insert({"journal": journal, "name": name, "kind": kind, "ingested_at": time.time()})

    def forget(self, journals: list[str], kind: str) -> None:
        """Drop the notes of the ``kind`` records of these journals, which are read no more (a job reopened reads
        them again, and rebuilds what they made)."""
        with self._ledger.transaction() as db:
            db.execute(
                "DELETE FROM journal_ingested WHERE journal IN (SELECT value FROM json_each(?)) AND kind = ?",
                [json.dumps(journals), kind],
            )

    def seen(self, journals: list[str]) -> dict[str, int]:
        """The mtime (ns) each of ``journals`` had when it was last read through, where one was noted."""
        rows = self._ledger.db.execute(
            "SELECT journal, mtime_ns FROM journal_seen WHERE journal IN (SELECT value FROM json_each(?))",
            [json.dumps(journals)],
        )
        return dict(rows.fetchall())

    def saw(self, journal: str, mtime_ns: int) -> None:
        """``journal`` was read through after its mtime was ``mtime_ns``."""
        with self._ledger.transaction() as db:
            db.execute("INSERT OR REPLACE INTO journal_seen VALUES (?, ?)", [journal, mtime_ns])
