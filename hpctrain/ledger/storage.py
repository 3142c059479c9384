"""Where the ledger file may live, and how SQLite keeps it there: decided from the mount that holds it.

SQLite's WAL mode keeps its index in memory shared by the processes of one host (the ``-shm`` file), so a WAL
ledger on a network or parallel file system is corrupted as soon as two hosts (two login nodes behind one name)
open it. So WAL only where the file system is a local one. On a shared file system whose POSIX locks hold across
hosts (NFS with its lock manager, GPFS, CephFS, Lustre mounted with ``flock``) the ledger keeps SQLite's rollback
journal, which locks the file itself (with ``synchronous=FULL``). Where locks are local to each host (sshfs and
other FUSE file systems, SMB, 9p, BeeGFS by default, Lustre without ``flock``, NFS mounted ``nolock``) no mode
is safe for several hosts: the ledger is refused, in one line naming the fix. A file system hpctrain does not
know gets the rollback journal (safe on one host, and what SQLite does by default).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.contract import LEDGER_ENV
from hpctrain.errors import LedgerError
from hpctrain.files import Mount, mount_of

LOCAL_FILESYSTEMS = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "bcachefs", "jfs", "reiserfs", "tmpfs", "ramfs", "overlay"}
)
SHARED_WITH_LOCKS = frozenset({"nfs", "nfs4", "gpfs", "ceph", "lustre"})
HOST_LOCAL_LOCKS = frozenset({"cifs", "smb3", "9p", "beegfs", "fuse"})
FIX = f"set ledger.path in the site config (or {LEDGER_ENV}) to a local disk, or to NFS, GPFS, CephFS or Lustre"


@dataclass(frozen=True)
class Storage:
    """How the ledger is kept: SQLite's journal mode and synchronous level, and why."""

    fstype: str
    journal_mode: str  # "wal" or "delete"
    synchronous: str
    shared: bool  # on a file system other hosts may open it on

    def describe(self) -> str:
        if self.journal_mode == "wal":
            return f"{self.fstype}: WAL, one host (a local disk)"
        return f"{self.fstype}: rollback journal, synchronous={self.synchronous}" + (
            ", safe for several hosts" if self.shared else ", one host (file system not known to hpctrain)"
        )


def locks_only_this_host(mount: Mount) -> str | None:
    """Why POSIX locks on ``mount`` do not reach the other hosts that mount it, or None where they do."""
    base = mount.fstype.partition(".")[0]
    if base in HOST_LOCAL_LOCKS:
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


def storage_for(path: Path, mount: Mount | None = None) -> Storage:
    """The mode of a ledger at ``path`` (its mount read from the mount table unless given); LedgerError where no
    mode is safe there."""
    mount = mount if mount is not None else mount_of(path)
    if mount is None:
        return Storage("unknown", "delete", "FULL", shared=False)
    why = locks_only_this_host(mount)
    if why:
        raise LedgerError(
            f"{path}: a ledger cannot live on {mount.point} ({why}, so hosts sharing it would corrupt it): {FIX}"
        )
    if mount.fstype in LOCAL_FILESYSTEMS:
        return Storage(mount.fstype, "wal", "NORMAL", shared=False)
    return Storage(mount.fstype, "delete", "FULL", shared=mount.fstype.partition(".")[0] in SHARED_WITH_LOCKS)
