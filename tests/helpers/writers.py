"""A ledger writer under load, as cron ticks, reconcile runs and CLI commands write at once: `writer` in a process
pool, or `python -m helpers.writers LEDGER N [WRITES]` (on another login host: helpers.hosts), which exits 1 with
its error on stderr."""

from __future__ import annotations

import sys

from hpctrain.ledger import Ledger

WRITES = 1000


def writer(path: str, n: int, writes: int = WRITES) -> str | None:
    """``writes`` events of writer ``n``, every tenth in a read-then-write transaction; the error, or None."""
    try:
        with Ledger(path) as ledger:
            for i in range(writes):
                if i % 10:
                    ledger.event("load", f"writer {n} write {i}", writer=n)
                else:  # read-then-write transactions too, the pattern that deadlocks without BEGIN IMMEDIATE
                    with ledger.transaction():
                        count = ledger.db.execute("SELECT count(*) FROM events WHERE kind = 'load'").fetchone()[0]
                        ledger.event("load", f"writer {n} write {i} after {count}", writer=n)
    except Exception as exc:  # reported to the parent, which fails the test with it
        return f"writer {n}: {exc!r}"
    return None


if __name__ == "__main__":
    error = writer(sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:]))
    if error:
        sys.exit(error)
