"""Exports from one ledger into one target take turns: a lock file beside the ledger per target (its name a digest
of the target, credentials never part of it), held across hosts (`hpctrain.files.exclusive_lock`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from hpctrain.errors import HpctrainError
from hpctrain.files import exclusive_lock
from hpctrain.ledger import Ledger

WAIT_S = 900.0  # an export from cron waits out one still running before it gives up


@contextmanager
def export_lock(ledger: Ledger, target: str, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold the lock of exports from ``ledger`` to ``target`` (a tracker's key, without credentials)."""
    digest = hashlib.sha256(target.encode()).hexdigest()[:16]
    path = ledger.path.parent / f".{ledger.path.name}.export-{digest}.lock"
    with ExitStack() as held:
        try:
            held.enter_context(exclusive_lock(path, wait_s))
        except TimeoutError:
            raise HpctrainError(f"{target}: another export there is still running after {wait_s:g}s") from None
        yield
