"""Concurrent writers on one ledger (cron ticks, reconcile runs and CLI commands at once): nothing lost,
nobody fails with "database is locked", and a new ledger is owner-only."""

import multiprocessing as mp
import stat

import pytest

from hpctrain.ledger import Ledger

from helpers.writers import WRITES, writer

WRITERS = 8


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
