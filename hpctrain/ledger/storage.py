"""Where the ledger file may live, and how SQLite keeps it there: decided from the mount that holds it and, where
its type cannot tell, from the coherence probe's recorded result (`hpctrain.ledger.probes`).

SQLite's WAL mode keeps its index in memory shared by the processes of one host (the ``-shm`` file), so a WAL
ledger on a network or parallel file system is corrupted as soon as two hosts (two login nodes behind one name)
open it. So WAL only where the file system is a local one. Elsewhere SQLite's rollback journal (with
``synchronous=FULL``), which needs two things of the file system: POSIX locks that hold across hosts, and reads
under such a lock that see what other hosts wrote before they released it.

- Both hold for NFS with its lock manager, GPFS, kernel CephFS and Lustre mounted with ``flock``.
- Locks stay on each host on sshfs, SMB, 9p, BeeGFS by default, Lustre without ``flock`` and NFS mounted
  ``nolock``: no mode is safe for several hosts, and the ledger is refused there.
- Other FUSE file systems (GlusterFS among them) keep locks across hosts, but whether reads under them are fresh
  depends on client caches set on the servers and the mounts, invisible in the mount table: the ledger is kept
  there once the probe passed on that mount (`hpctrain doctor --ledger`), and refused until then.

A failed probe refuses any mount it was run on. A file system hpctrain does not know gets the rollback journal
(safe on one host, and what SQLite does by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.contract import LEDGER_ENV
from hpctrain.errors import LedgerError
from hpctrain.files import Mount, mount_of
from hpctrain.ledger.probes import ProbeRecord, recorded

LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs", "tmpfs", "ramfs", "overlay"}
)
SHARED_WITH_LOCKS = frozenset({"nfs", "nfs4", "gpfs", "ceph", "lustre"})
HOST_LOCAL_LOCKS = frozenset({"cifs", "smb3", "9p", "beegfs", "fuse.sshfs"})
FIX = f"set ledger.path in the site config (or {LEDGER_ENV}) to a local disk, or to NFS, GPFS, CephFS or Lustre"
PROBE = "run `hpctrain doctor --ledger` to probe it from two hosts"
# What makes reads under a lock fresh, by file system, in the words of the site's admins.
FRESH_READS = {
    "fuse.glusterfs": "GlusterFS keeps SQLite whole with the volume options `group db-workload` and "
    "`performance.open-behind off`, and mounts with `-o direct-io-mode=enable,attribute-timeout=0,entry-timeout=0`",
    "nfs": "NFS keeps SQLite whole mounted with its lock manager (no `nolock`), `lookupcache=positive` and `actimeo=0`",
}


@dataclass(frozen=True)
class Storage:
    """How the ledger is kept: SQLite's journal mode and synchronous level, and why."""

    fstype: str
    journal_mode: str  # "wal" or "delete"
    synchronous: str
    shared: bool  # on a file system other hosts may open it on
    probe: ProbeRecord | None = None  # the passed probe that lets it be there

    def describe(self) -> str:
        if self.journal_mode == "wal":
            return f"{self.fstype}: WAL, one host (a local disk)"
        said = f"{self.fstype}: rollback journal, synchronous={self.synchronous}"
        if self.probe is not None:
            return f"{said}, safe for several hosts (probed {self.probe.day()} with {self.probe.peer})"
        return said + (", safe for several hosts" if self.shared else ", one host (file system not known to hpctrain)")


def fresh_reads_fix(fstype: str) -> str:
    """The options that make reads under a lock fresh on ``fstype``, where hpctrain knows them ("" elsewhere)."""
    return FRESH_READS.get(fstype) or FRESH_READS.get("nfs" if fstype.startswith("nfs") else fstype, "")


def locks_only_this_host(mount: Mount) -> str | None:
    """Why POSIX locks on ``mount`` do not reach the other hosts that mount it, or None where they do."""
    base = mount.fstype.partition(".")[0]
    if mount.fstype in HOST_LOCAL_LOCKS or base in HOST_LOCAL_LOCKS:
        return f"{mount.fstype} keeps file locks on each host"
    if base == "lustre" and mount.option("flock") is None:
        return "lustre is mounted without flock (its locks are per client)"
    if base in ("nfs", "nfs4"):
        local_lock = mount.option("local_lock")
        if mount.option("nolock") is not None:
            return f"{mount.fstype} is mounted with nolock"
        if local_lock in ("all", "posix"):
            return f"{mount.fstype} is mounted with local_lock={local_lock}"
    return None


def needs_probe(mount: Mount) -> bool:
    """Whether only the probe can tell if ``mount`` is safe for a ledger shared by hosts: a FUSE file system
    not known to keep its locks on each host."""
    return mount.fstype == "fuse" or (mount.fstype.startswith("fuse.") and mount.fstype not in HOST_LOCAL_LOCKS)


def is_local(mount: Mount | None) -> bool:
    return mount is not None and mount.fstype in LOCAL_FILESYSTEMS


def storage_for(path: Path, mount: Mount | None = None, probe: ProbeRecord | None = None) -> Storage:
    """The mode of a ledger at ``path`` (its mount read from the mount table and its probe from the records,
    unless given); LedgerError where no mode is safe there."""
    mount = mount if mount is not None else mount_of(path)
    if mount is None:
        return Storage("unknown", "delete", "FULL", shared=False)
    where = f"{path}: a ledger cannot live on {mount.point}"
    why = locks_only_this_host(mount)
    if why:
        raise LedgerError(f"{where} ({why}, so hosts sharing it would corrupt it): {FIX}")
    if is_local(mount):
        return Storage(mount.fstype, "wal", "NORMAL", shared=False)
    probe = probe or recorded(mount)
    fix = fresh_reads_fix(mount.fstype)
    if probe is not None and not probe.passed:
        raise LedgerError(
            f"{where} (when probed on {probe.day()} with {probe.peer}, reads under its locks were stale: "
            f"{probe.detail}): {fix + ', then ' if fix else ''}{PROBE}; or {FIX}"
        )
    if needs_probe(mount) and probe is None:
        raise LedgerError(
            f"{where} until probed ({mount.fstype} keeps file locks across hosts, but its clients' caches may serve "
            f"stale reads under them, which corrupts SQLite): {PROBE}{' (' + fix + ')' if fix else ''}; or {FIX}"
        )
    shared = mount.fstype.partition(".")[0] in SHARED_WITH_LOCKS or probe is not None
    return Storage(mount.fstype, "delete", "FULL", shared=shared, probe=probe)
