"""The SQLite ledger: jobs, array tasks, attempts, checkpoints, metrics, sweeps, events. Names load on first
use: compute nodes write the journal (`hpctrain.ledger.journal`) without importing SQLite's stack."""

from hpctrain.lazy import lazy_exports

_EXPORTS = {"Ledger": "db", "SCHEMA_VERSION": "schema"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
