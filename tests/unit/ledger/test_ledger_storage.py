"""The ledger's mode from the mount that holds it (hpctrain.ledger.storage): WAL on a local disk only, SQLite's
rollback journal on a file system whose locks hold across hosts, refused in one line where locks stay on each host;
on GlusterFS and other FUSE file systems, what the coherence probe recorded decides. Mount tables are recorded
lines of real mounts (this machine has no NFS client; its GlusterFS lines are from scripts/gluster-home)."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path

import pytest

import hpctrain.ledger.storage as storage
from hpctrain.errors import LedgerError
from hpctrain.files import holding, mount_of, parse_mountinfo
from hpctrain.ledger import Ledger
from hpctrain.ledger.probes import record, recorded

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
42 27 0:39 / /gluster/home rw,relatime - fuse.glusterfs localhost:/safe rw,user_id=0,group_id=0,default_permissions,allow_other,max_read=131072
43 27 0:40 / /ceph rw,relatime - fuse.ceph-fuse ceph-fuse rw,user_id=0,group_id=0,allow_other
"""
MOUNTS = {m.point: m for m in parse_mountinfo(MOUNTINFO)}


@pytest.fixture(autouse=True)
def probes_here(monkeypatch, tmp_path):
    """Probe records in this test's own state folder."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


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


def test_a_mount_hidden_under_a_network_mount_over_its_parent_is_not_the_path_s():
    """Issue 56.13: /home/alice/local (ext4) was mounted, then NFS over /home, which hides it: a ledger under
    /home/alice/local is on NFS, as its st_dev says, and must not get WAL."""
    hidden = parse_mountinfo("29 1 254:0 / / rw - ext4 /dev/vda rw\n"
                             "40 29 254:16 / /home/alice/local rw - ext4 /dev/vdb rw\n"
                             "58 29 0:50 / /home rw - nfs4 fs1:/export/home rw,vers=4.2,local_lock=none\n")
    assert holding("/home/alice/local/ledger.db", hidden, (0, 50)).fstype == "nfs4"
    assert holding("/home/alice/local/ledger.db", hidden, (254, 16)).point == "/home/alice/local"
    assert holding("/home/alice/local/ledger.db", hidden, (0, 99)).point == "/home/alice/local"  # none: longest
    assert storage.storage_for(Path("/home/alice/local/ledger.db"), holding(
        "/home/alice/local/ledger.db", hidden, (0, 50))).journal_mode == "delete"


def test_the_mount_is_the_one_of_the_file_s_device_and_a_dangling_link_s_target_s(tmp_path):
    st_dev = tmp_path.stat().st_dev
    device = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    table = tmp_path / "mountinfo"
    table.write_text(f"1 0 {device} / / rw - ext4 /dev/vda rw\n"  # a local disk hidden under the NFS mount
                     f"2 1 254:99 / {tmp_path} rw - xfs /dev/vdz rw\n"
                     f"3 1 0:7 / /elsewhere rw - nfs4 fs:/x rw\n")
    assert mount_of(tmp_path / "ledger.db", table).point == "/"
    # a dangling link: on the mount of its target's folder, not of the link's
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == st_dev:
        pytest.skip("no /dev/shm of its own here")
    (tmp_path / "link.db").symlink_to(shm / "hpctrain-missing" / "ledger.db")
    assert mount_of(tmp_path / "link.db").point == "/dev/shm"
    assert mount_of(tmp_path / "link.db").fstype == "tmpfs"


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
    ("/gluster/home", "until probed (fuse.glusterfs keeps file locks across hosts, but its clients' caches may serve "
                      "stale reads under them, which corrupts SQLite): run `hpctrain doctor --ledger`"),
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


@pytest.mark.parametrize("point", ["/gluster/home", "/ceph", "/home"])
def test_a_probe_that_passed_lets_the_ledger_share_its_mount_and_one_that_failed_refuses_it(point):
    """Issue 60: locks hold on GlusterFS, but whether reads under them are fresh is the volume's and the mounts'
    options, which the mount table does not show: the probe's record decides, for FUSE file systems and for any
    mount it failed on (NFS too)."""
    mount, path = MOUNTS[point], Path(point) / "ledger.db"
    if point != "/home":
        with pytest.raises(LedgerError, match="until probed"):
            storage.storage_for(path, mount)
    record(mount, True, "100 turns on each host under the lock, every read fresh", "a job on partition gpu (n1)")
    kept = storage.storage_for(path, mount)
    assert (kept.journal_mode, kept.synchronous, kept.shared) == ("delete", "FULL", True)
    assert kept.describe().endswith(f"safe for several hosts (probed {time.strftime('%Y-%m-%d')} with a job on "
                                    "partition gpu (n1))")
    record(mount, False, "the peer read stale data in 99 of 100 turns", "login2")
    with pytest.raises(LedgerError) as refused:
        storage.storage_for(path, mount)
    message = str(refused.value)
    assert message.startswith(f"{path}: a ledger cannot live on {point} (when probed on ") and (
        "with login2, reads under its locks were stale: the peer read stale data in 99 of 100 turns)") in message
    assert "\n" not in message and "run `hpctrain doctor --ledger` to probe it from two hosts" in message
    fix = {"/gluster/home": "volume options `group db-workload` and `performance.open-behind off`, and mounts with "
                            "`-o direct-io-mode=enable,attribute-timeout=0,entry-timeout=0`",
           "/home": "mounted with its lock manager (no `nolock`), `lookupcache=positive` and `actimeo=0`"}
    assert fix.get(point, "") in message


def test_a_probe_is_of_its_mount_alone_and_locks_kept_on_each_host_are_refused_whatever_it_said():
    gluster = MOUNTS["/gluster/home"]
    record(gluster, True, "every read fresh", "login2")
    remounted = dataclasses.replace(gluster, options=gluster.options | {"attribute-timeout=1"})
    elsewhere = dataclasses.replace(gluster, point="/other", device=(0, 99))  # another host's mount of it
    assert recorded(remounted) is None and recorded(elsewhere) is not None
    with pytest.raises(LedgerError, match="until probed"):
        storage.storage_for(Path("/gluster/home/l.db"), remounted)
    sshfs = MOUNTS["/home/alice/remote"]
    record(sshfs, True, "every read fresh", "login2")
    with pytest.raises(LedgerError, match="fuse.sshfs keeps file locks on each host"):
        storage.storage_for(Path("/home/alice/remote/l.db"), sshfs)


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
