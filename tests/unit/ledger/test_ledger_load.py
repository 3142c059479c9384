"""Concurrent writers on one ledger (cron ticks, reconcile runs and CLI commands at once): nothing lost,
nobody fails with "database is locked", and a new ledger is owner-only."""

import multiprocessing as mp
import stat

import pytest

from hpctrain.ledger import Ledger

WRITERS, WRITES = 8, 1000


def writer(path: str, n: int) -> str | None:
    try:
        with Ledger(path) as ledger:
            for i in range(WRITES):
                if i % 10:
                    ledger.event("load", f"writer {n} write {i}", writer=n)
                else:  # read-then-write transactions too, the pattern that deadlocks without BEGIN IMMEDIATE
                    with ledger.transaction():
                        count = ledger.db.execute("SELECT count(*) FROM events WHERE kind = 'load'").fetchone()[0]
                        ledger.event("load", f"writer {n} write {i} after {count}", writer=n)
    except Exception as exc:  # reported to the parent, which fails the test with it
        return f"writer {n}: {exc!r}"
    return None


@pytest.mark.slow
def test_eight_writers_lose_nothing_and_never_see_locked(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger(path).close()
    with mp.get_context("spawn").Pool(WRITERS) as pool:
        errors = [e for e in pool.starmap(writer, [(path, n) for n in range(WRITERS)]) if e]
    assert errors == []
    with Ledger(path) as ledger:
        rows = ledger.db.execute("SELECT count(*), count(DISTINCT message) FROM events WHERE kind = 'load'").fetchone()
    assert tuple(rows) == (WRITERS * WRITES, WRITERS * WRITES)


def test_a_new_ledger_is_owner_only_unless_the_site_says_otherwise(tmp_path):
    Ledger(tmp_path / "private.db").close()
    Ledger(tmp_path / "shared.db", mode=0o640).close()
    assert stat.S_IMODE((tmp_path / "private.db").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "shared.db").stat().st_mode) & 0o077 == 0o040
