"""The journal_ingested table: the journal records (by file name) already folded into the ledger, so that
`hpctrain.ledger.ingest` folds each exactly once."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from hpctrain.ledger.rows import IngestedRow
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class Ingested:
    """Rows of `journal_ingested`, keyed by (journal directory, record file name)."""

    def __init__(self, ledger: Ledger):
        self._rows: Table[IngestedRow] = Table(ledger, "journal_ingested", ("journal", "name"))

    def names(self, journal: str) -> set[str]:
        """The records of ``journal`` folded in."""
        return {r["name"] for r in self._rows.rows("journal = ?", [journal])}

    def has(self, journal: str, name: str) -> bool:
        return self._rows.get((journal, name)) is not None

    def add(self, journal: str, name: str, kind: str) -> None:
        self._rows.insert({"journal": journal, "name": name, "kind": kind, "ingested_at": time.time()})
