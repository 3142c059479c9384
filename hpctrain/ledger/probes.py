"""The coherence probe's results (`hpctrain.ledger.coherence`), recorded per mount: where a mount passed, later
commands keep their ledger there without probing again, until the mount changes (its type, source or options:
another mount is another key); where it failed, the ledger is refused there with what the probe saw.

Kept in the user's state folder ($XDG_STATE_HOME/hpctrain/ledger-probes.json), a file of its own: the ledger is
what is being judged. Written whole (a temporary file renamed) under a lock, so two probes at once lose nothing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hpctrain.files import Mount, exclusive_lock, write_json_atomic

LOCK_TIMEOUT_S = 30.0


def records_path() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path("~/.local/state").expanduser())
    return Path(state) / "hpctrain" / "ledger-probes.json"


def mount_key(mount: Mount) -> str:
    """What identifies a mount on every host that has it: type, source and options (not the device numbers, which
    each host's kernel gives on its own)."""
    return f"{mount.fstype} {mount.source} {','.join(sorted(mount.options))}"


@dataclass(frozen=True)
class ProbeRecord:
    """One probe of a mount: passed or not, what it saw, with which peer, and when (seconds since the epoch)."""

    key: str
    point: str
    passed: bool
    detail: str
    peer: str
    at: float

    def day(self) -> str:
        return time.strftime("%Y-%m-%d", time.localtime(self.at))


def _read(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        return {}  # unreadable or damaged: as if never probed (a probe writes it whole again)
    return data if isinstance(data, dict) else {}


def recorded(mount: Mount, path: Path | None = None) -> ProbeRecord | None:
    """The newest probe of ``mount``, or None."""
    entry = _read(path or records_path()).get(mount_key(mount))
    try:
        return ProbeRecord(**entry) if isinstance(entry, dict) else None
    except TypeError:
        return None


def record(mount: Mount, passed: bool, detail: str, peer: str, path: Path | None = None) -> ProbeRecord:
    """Record a probe of ``mount`` (replacing the one before)."""
    path = path or records_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    entry = ProbeRecord(mount_key(mount), mount.point, passed, detail, peer, time.time())
    with exclusive_lock(path.with_name(path.name + ".lock"), LOCK_TIMEOUT_S):
        data = _read(path)
        data[entry.key] = asdict(entry)
        write_json_atomic(path, data, mode=0o600)
    return entry
