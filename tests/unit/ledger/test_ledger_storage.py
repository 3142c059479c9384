"""The ledger's mode from the mount that holds it (hpctrain.ledger.storage): WAL on a local disk only, SQLite's
rollback journal on a file system whose locks hold across hosts, refused in one line where locks stay on each host.
Mount tables are recorded lines of real mounts (this machine has no NFS client)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

import hpctrain.ledger.storage as storage
from hpctrain.errors import LedgerError
from hpctrain.files import holding, mount_of, parse_mountinfo
from hpctrain.ledger import Ledger

MOUNTINFO = r"""29 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
35 29 0:31 / /dev/shm rw,nosuid,nodev shared:4 - tmpfs tmpfs rw,size=24684084k
58 29 0:50 / /home rw,relatime shared:40 - nfs4 fs1:/export/home rw,vers=4.2,rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys,clientaddr=10.0.0.5,local_lock=none,addr=10.0.0.1
61 29 0:52 / /scratch rw,relatime shared:42 - nfs nas:/scratch rw,vers=3,rsize=65536,wsize=65536,namlen=255,hard,nolock,proto=tcp,timeo=600,retrans=2,sec=sys,mountaddr=10.0.0.2,mountvers=3,mountport=20048,mountproto=udp,local_lock=all,addr=10.0.0.2
70 29 0:60 / /lustre/fs1 rw,flock,lazystatfs shared:50 - lustre 10.0.0.3@o2ib:/fs1 rw,flock,lazystatfs
71 29 0:61 / /lustre/fs2 rw,localflock,lazystatfs shared:51 - lustre 10.0.0.3@o2ib:/fs2 rw,localflock,lazystatfs
80 29 0:70 / /gpfs/home rw,relatime shared:60 - gpfs home rw
90 58 0:80 / /home/alice/remote rw,nosuid,nodev,relatime shared:70 - fuse.sshfs alice@login:/home/alice rw,user_id=1000,group_id=1000
95 29 0:90 / /mnt/my\040disk rw,relatime shared:80 - xfs /dev/vdb rw
99 29 0:95 / /data rw,relatime shared:90 - virtiofs data rw
"""
MOUNTS = {m.point: m for m in parse_mountinfo(MOUNTINFO)}


@pytest.fixture
def mounted_on(monkeypatch):
    """Make every path look as if it were on the recorded mount at ``point``."""

    def on(point: str) -> None:
        monkeypatch.setattr(storage, "mount_of", lambda path: MOUNTS[point])

    return on


def test_the_mount_of_a_path_is_the_longest_mount_point_above_it(tmp_path):
    mounts = parse_mountinfo(MOUNTINFO)
    points = {p: holding(p, mounts).point for p in (
        "/home/alice/ledger.db", "/home/alice/remote/x/y.db", "/homework", "/mnt/my disk/l.db", "/lustre/fs1/a")}
    assert points == {"/home/alice/ledger.db": "/home", "/home/alice/remote/x/y.db": "/home/alice/remote",
                      "/homework": "/", "/mnt/my disk/l.db": "/mnt/my disk", "/lustre/fs1/a": "/lustre/fs1"}
    # On this machine: a file not made yet is on its folder's mount; no mount table, no answer.
    assert mount_of(tmp_path / "not" / "yet.db") == mount_of(tmp_path) is not None
    assert tmp_path.as_posix().startswith(mount_of(tmp_path).point)
    assert mount_of(tmp_path, tmp_path / "no-mountinfo") is None


@pytest.mark.parametrize(("point", "mode", "shared"), [
    ("/", "wal", False), ("/dev/shm", "wal", False), ("/mnt/my disk", "wal", False),
    ("/home", "delete", True), ("/lustre/fs1", "delete", True), ("/gpfs/home", "delete", True),
    ("/data", "delete", False),
])
def test_wal_only_on_a_local_disk_the_rollback_journal_where_locks_hold_across_hosts(point, mode, shared):
    chosen = storage.storage_for(Path(point) / "ledger.db", MOUNTS[point])
    assert (chosen.journal_mode, chosen.shared) == (mode, shared)
    assert chosen.synchronous == ("NORMAL" if mode == "wal" else "FULL")


@pytest.mark.parametrize(("point", "why"), [
    ("/scratch", "nfs is mounted with nolock"),
    ("/lustre/fs2", "lustre is mounted without flock"),
    ("/home/alice/remote", "fuse.sshfs keeps file locks on each host"),
])
def test_where_locks_stay_on_each_host_the_ledger_is_refused_in_one_line_naming_the_fix(point, why, mounted_on,
                                                                                          tmp_path):
    mounted_on(point)
    path = tmp_path / "sub" / "ledger.db"
    with pytest.raises(LedgerError) as refused:
        Ledger(path)
    message = str(refused.value)
    assert "\n" not in message and why in message and "set ledger.path in the site config" in message
    assert not path.parent.exists()  # nothing written


def test_on_a_shared_file_system_the_ledger_keeps_the_rollback_journal(mounted_on, tmp_path):
    mounted_on("/home")
    with Ledger(tmp_path / "ledger.db") as ledger:
        ledger.analyze()  # a write transaction
        modes = [ledger.db.execute(f"PRAGMA {p}").fetchone()[0] for p in ("journal_mode", "synchronous")]
        assert ledger.storage.describe() == "nfs4: rollback journal, synchronous=FULL, safe for several hosts"
    assert modes == ["delete", 2]  # 2: FULL
    assert not (tmp_path / "ledger.db-wal").exists() and not (tmp_path / "ledger.db-shm").exists()


def test_a_wal_ledger_moved_to_a_shared_file_system_leaves_wal_unless_another_process_has_it_open(mounted_on,
                                                                                                   tmp_path):
    path = tmp_path / "ledger.db"
    Ledger(path).close()  # made on the local disk: WAL
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    mounted_on("/home")
    other = sqlite3.connect(path)
    other.execute("SELECT count(*) FROM jobs").fetchone()  # holds the WAL index open
    with pytest.raises(LedgerError, match="in WAL mode and open in another process; on nfs4 it must leave WAL"):
        Ledger(path)
    other.close()
    with Ledger(path) as ledger:
        assert ledger.db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_doctor_passes_the_default_ledger_path_in_a_home_directory_on_nfs_and_names_the_mode(mounted_on, tmp_path,
                                                                                            monkeypatch):
    """A site config that keeps ledger.path's default (~/.local/share/hpctrain/ledger.db), home directories on NFS."""
    from hpctrain.config import load_site
    from hpctrain.doctor.cluster import Doctor

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HPCTRAIN_LEDGER")
    mounted_on("/home")
    site = load_site("dev")
    check = Doctor(site)._ledger()
    path = tmp_path / ".local" / "share" / "hpctrain" / "ledger.db"
    assert site.ledger.path == path and check.verdict == "PASS"
    assert check.detail.startswith(f"{path} (schema v") and check.detail.endswith(
        "; nfs4: rollback journal, synchronous=FULL, safe for several hosts)")
