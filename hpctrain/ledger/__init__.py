"""The SQLite ledger: jobs, array tasks, attempts, checkpoints, metrics, sweeps, events. Names load on first
use: compute nodes write the journal (`hpctrain.ledger.journal`) without importing SQLite's stack."""

from typing import TYPE_CHECKING

from hpctrain.lazy import lazy_exports

if TYPE_CHECKING:  # the names' types, which the lazy __getattr__ would leave Any
    from hpctrain.ledger.db import Ledger as Ledger
    from hpctrain.ledger.schema import SCHEMA_VERSION as SCHEMA_VERSION

_EXPORTS = {"Ledger": "db", "SCHEMA_VERSION": "schema"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
