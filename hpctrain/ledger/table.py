"""Generic row access to one table, private to the ledger: each table class (`ledger.jobs`, ...) holds one for every
table it owns and gives its reads and writes their names. Nothing outside the ledger names a table."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from hpctrain.ledger.sqlite import sqlite_utils

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger

Row = TypeVar("Row", bound=Mapping[str, Any])


class Table(Generic[Row]):
    """The rows of table ``name`` (primary key ``pk``), read as ``Row``; every write is a transaction of its own, or
    part of the one open."""

    def __init__(self, ledger: Ledger, name: str, pk: str | tuple[str, ...] = "id"):
        self.ledger, self.name, self.pk = ledger, name, pk

    def insert(self, row: Mapping[str, Any]) -> int:
        """Insert one row; returns its rowid."""
        with self.ledger.transaction() as db:
            rowid = db.table(self.name).insert(_encode(row)).last_rowid
        assert rowid is not None  # every ledger table has rowids
        return rowid

    def insert_all(self, rows: Iterable[Mapping[str, Any]]) -> None:
        with self.ledger.transaction() as db:
            db.table(self.name).insert_all(_encode(r) for r in rows)

    def upsert(self, row: Mapping[str, Any]) -> None:
        """Insert the row, or update the columns it has of the row with its primary key."""
        self.upsert_all([row])

    def upsert_all(self, rows: Iterable[Mapping[str, Any]]) -> None:
        with self.ledger.transaction() as db:
            db.table(self.name).upsert_all((_encode(r) for r in rows), pk=self.pk)

    def update(self, key: Any, fields: Mapping[str, Any]) -> None:
        """Set ``fields`` of the row whose primary key is ``key`` (a tuple for a compound key)."""
        with self.ledger.transaction() as db:
            db.table(self.name).update(key, _encode(fields))

    def delete(self, key: Any) -> None:
        """Delete the row whose primary key is ``key``."""
        with self.ledger.transaction() as db:
            db.table(self.name).delete(key)

    def rows(
        self,
        where: str | None = None,
        params: Any = None,
        order_by: str | None = None,
        limit: int | None = None,
        index: str | None = None,
    ) -> list[Row]:
        """The rows ``where`` holds; through ``index`` alone when given (a plan that holds whatever the statistics)."""
        sql = f'SELECT * FROM "{self.name}"' + (f" INDEXED BY {index}" if index else "")
        sql += (f" WHERE {where}" if where else "") + (f" ORDER BY {order_by}" if order_by else "")
        cursor = self.ledger.db.execute(sql + (f" LIMIT {int(limit)}" if limit is not None else ""), params or [])
        columns = [c[0] for c in cursor.description]
        return cast("list[Row]", [dict(zip(columns, r, strict=True)) for r in cursor])

    def first(self, where: str, params: Any, order_by: str | None = None) -> Row | None:
        found = self.rows(where, params, order_by, limit=1)
        return found[0] if found else None

    def get(self, key: Any) -> Row | None:
        try:
            return cast("Row", self.ledger.db.table(self.name).get(key))
        except sqlite_utils.db.NotFoundError:
            return None


def ids_json(ids: Iterable[int]) -> str:
    """Ids as one JSON array parameter, for ``IN (SELECT value FROM json_each(?))`` or a walk over each."""
    return json.dumps(sorted(set(ids)))


def _encode(row: Mapping[str, Any]) -> dict[str, Any]:
    """Columns named *_json hold JSON; everything else is stored as given."""
    return {
        k: (
            json.dumps(v, sort_keys=True, default=str)
            if k.endswith("_json") and v is not None and not isinstance(v, str)
            else v
        )
        for k, v in row.items()
    }
