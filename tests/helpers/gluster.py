"""A home file system on GlusterFS (scripts/gluster-home): volume ``safe`` with the options that keep SQLite whole
across clients, ``plain`` with Gluster's defaults, each mounted twice (clients ``a`` and ``b``). The dev cluster's
jobs and the test process see a volume through client a; a second login host sees it through client b, bound over
a's mount point in its own mount namespace (helpers.hosts)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from helpers.paths import REPO

ROOT = Path(os.environ.get("HPCTRAIN_GLUSTER_ROOT", "/var/tmp/hpctrain-gluster"))


def gluster_up() -> Path:
    """The Gluster home's root, brought up if it is not (idempotent; one glusterd per machine, shared by workers;
    a lane sees the host's, which scripts/test brings up before the lanes start)."""
    script = str(REPO / "scripts" / "gluster-home")
    if subprocess.run([script, "status"], capture_output=True).returncode == 0:
        return ROOT
    up = subprocess.run([script, "up"], capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, f"scripts/gluster-home up failed:\n{up.stdout}\n{up.stderr}"
    return ROOT


def second_client(volume: str) -> list[tuple[Path, Path]]:
    """The binds that make a login host see ``volume`` through client b."""
    return [(ROOT / volume / "b", ROOT / volume / "a")]
