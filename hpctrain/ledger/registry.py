"""The registry's tables: named models with their gates, immutable versions (each a checkpoint of a job's task),
aliases that point at one version, and every move of an alias (`registered_models`, `model_versions`,
`model_aliases`, `alias_moves`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import AliasMoveRow, AliasRow, ModelRow, VersionRow
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class Registry:
    """Rows of the registry's tables. Versions are numbered from 1 per model in the transaction that adds them;
    a checkpoint is one version of a model; an alias moves only from where its mover saw it (``move``: its version
    and its newest move), so of two moves decided at once one wins."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._models: Table[ModelRow] = Table(ledger, "registered_models", "name")
        self._versions: Table[VersionRow] = Table(ledger, "model_versions", ("model", "version"))
        self._aliases: Table[AliasRow] = Table(ledger, "model_aliases", ("model", "alias"))
        self._moves: Table[AliasMoveRow] = Table(ledger, "alias_moves")

    def model(self, name: str) -> ModelRow | None:
        return self._models.get(name)

    def models(self) -> list[ModelRow]:
        return self._models.rows(order_by="name")

    def add_version(self, model: ModelRow, version: dict[str, Any]) -> tuple[int, bool]:
        """Add the next version of ``model`` (creating the model with its gate if it is new): (its number, True);
        (the number, False) if the checkpoint is a version of the model already. ``version`` holds every column of
        `model_versions` but the model's name and the number."""
        with self.ledger.transaction() as db:
            known = self.version_of(model["name"], version["job_id"], version["task_index"], version["step"])
            if known is not None:
                return known["version"], False
            if self.model(model["name"]) is None:
                self._models.insert(model)
            row = db.execute(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM model_versions WHERE model = ?", [model["name"]]
            ).fetchone()
            number = int(row[0])
            self._versions.insert({**version, "model": model["name"], "version": number})
        return number, True

    def version_of(self, model: str, job_id: int, task_index: int, step: int) -> VersionRow | None:
        """The version of ``model`` registered from one checkpoint (the first, where an older ledger has two)."""
        return self._versions.first(
            "model = ? AND job_id = ? AND task_index = ? AND step = ?",
            [model, job_id, task_index, step],
            order_by="version",
        )

    def version(self, model: str, number: int) -> VersionRow | None:
        return self._versions.get((model, number))

    def versions(self, model: str) -> list[VersionRow]:
        return self._versions.rows("model = ?", [model], order_by="version")

    def versions_of(self, job_id: int, task_index: int, step: int) -> list[VersionRow]:
        """The versions registered from one checkpoint (of any model)."""
        return self._versions.rows(
            "job_id = ? AND task_index = ? AND step = ?", [job_id, task_index, step], order_by="model, version"
        )

    def alias(self, model: str, alias: str) -> AliasRow | None:
        return self._aliases.get((model, alias))

    def aliases(self, model: str) -> list[AliasRow]:
        return self._aliases.rows("model = ?", [model], order_by="alias")

    def seen(self, model: str, alias: str) -> tuple[int | None, int | None]:
        """(the version ``alias`` points at, the id of its newest move), read at once: what a move is decided on."""
        row = self.ledger.db.execute(
            "SELECT (SELECT version FROM model_aliases WHERE model = ? AND alias = ?), "
            "(SELECT MAX(id) FROM alias_moves WHERE model = ? AND alias = ?)",
            [model, alias, model, alias],
        ).fetchone()
        return row[0], row[1]

    def move(
        self, model: str, alias: str, seen: tuple[int | None, int | None], to: int | None, move: dict[str, Any]
    ) -> AliasMoveRow | None:
        """Point ``alias`` at version ``to`` (None: remove it) if it is still as ``seen`` saw it (``seen``: the
        version and the newest move's id), and keep the move (``move``: action, by, why, gate_json, undoes); None,
        changing nothing, if it has moved since, even back to the same version."""
        with self.ledger.transaction():
            if self.seen(model, alias) != seen:
                return None
            now, at = seen[0], time.time()
            if to is None:
                self._aliases.delete((model, alias))
            elif now is None:
                self._aliases.insert({"model": model, "alias": alias, "version": to, "moved_at": at})
            else:
                self._aliases.update((model, alias), {"version": to, "moved_at": at})
            rowid = self._moves.insert(
                {**move, "model": model, "alias": alias, "from_version": now, "to_version": to, "at": at}
            )
            found = self._moves.get(rowid)
        assert found is not None
        return found

    def moves(self, model: str, alias: str | None = None) -> list[AliasMoveRow]:
        """Every move of the model's aliases (of ``alias`` only, given one), oldest first."""
        if alias is None:
            return self._moves.rows("model = ?", [model], order_by="id")
        return self._moves.rows("model = ? AND alias = ?", [model, alias], order_by="id")

    def last_move_standing(self, model: str, alias: str) -> AliasMoveRow | None:
        """The newest promotion of ``alias`` that no rollback has undone: the one a rollback undoes next."""
        return self._moves.first(
            "model = ? AND alias = ? AND action != 'rollback' AND id NOT IN "
            "(SELECT undoes FROM alias_moves WHERE undoes IS NOT NULL)",
            [model, alias],
            order_by="id DESC",
        )
