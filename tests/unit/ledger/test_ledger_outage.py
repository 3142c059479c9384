"""A network home's server away and back: the Gluster home's volume ``flaky`` (scripts/gluster-home) with its one
brick killed and started again, as a file server that crashes and restarts. The ledger waits for it when it
opens and when a write starts, up to a bound, and past the bound says what failed, never that the ledger is
damaged."""

import shutil
import tempfile
from pathlib import Path

import pytest
from helpers.gluster import gluster_up, server_away

from hpctrain.errors import LedgerError
from hpctrain.files import mount_of
from hpctrain.ledger import Ledger, probes
from hpctrain.ledger.table import Table

pytestmark = pytest.mark.xdist_group("gluster-flaky")  # one server to kill: its tests one after another


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A folder on the flaky volume, whose mount counts as probed (the probe itself: test_login_hosts_cluster)."""
    point = gluster_up("flaky") / "flaky" / "a"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    probes.record(mount_of(point), True, "recorded by the test", "b")
    folder = Path(tempfile.mkdtemp(prefix="hpctrain-outage-", dir=point))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _messages(ledger: Ledger) -> list[str]:
    return [r["message"] for r in Table(ledger, "events").rows()]


def test_a_write_and_an_open_wait_for_a_server_that_comes_back(home):
    with Ledger(home / "l.db") as ledger:
        ledger.event("note", "before")
        with server_away("flaky", back_after_s=3):
            ledger.event("note", "while away")  # its descriptor stays dead: a new connection takes over
        ledger.event("note", "after")
    with server_away("flaky", back_after_s=3), Ledger(home / "l.db") as ledger:
        assert _messages(ledger) == ["before", "while away", "after"]
        assert ledger.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def test_a_server_away_past_the_bound_is_one_line_that_says_no_damage(home):
    ledger = Ledger(home / "l.db", away_s=2)
    ledger.event("note", "before")
    with server_away("flaky"):
        with pytest.raises(LedgerError, match=r"failed for 2 s \(.*\).* the ledger itself is not damaged$"):
            ledger.event("note", "lost")
        with pytest.raises(LedgerError, match=r"failed for 2 s \(Transport endpoint is not connected\)"):
            Ledger(home / "l.db", away_s=2)
    ledger.close()
    with Ledger(home / "l.db") as ledger:
        assert _messages(ledger) == ["before"]
