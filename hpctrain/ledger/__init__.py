"""The SQLite ledger: jobs, array tasks, attempts, checkpoints, metrics, sweeps, events."""

from hpctrain.ledger.db import Ledger
from hpctrain.ledger.schema import SCHEMA_VERSION

__all__ = ["Ledger", "SCHEMA_VERSION"]
