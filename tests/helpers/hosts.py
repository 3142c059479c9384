"""Login hosts of one site on this machine, for the tests of sites with several login nodes: a command given to
`on_host` runs in mount and UTS namespaces of its own (unshare), with its own host name, /tmp and /dev/shm, and
shares the rest (the home directory `host_env` names, the job folders, the dev cluster), as a second login node
behind the site's name would. A host may see a folder through a mount of its own (``binds``): a home on GlusterFS
through a second client (helpers.gluster)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from hpctrain.contract import LEDGER_ENV

ENTER = ('hostname "$0" && mount -t tmpfs -o mode=1777 tmpfs /tmp && mount -t tmpfs -o mode=1777 tmpfs /dev/shm '
         '&& exec "$@"')


def on_host(host: str, *argv: str, binds: Sequence[tuple[Path, Path]] = ()) -> list[str]:
    """``argv`` as run on login host ``host``, where each (source, target) of ``binds`` is mounted over target."""
    enter = "".join(f"mount --bind {shlex.quote(str(s))} {shlex.quote(str(t))} && " for s, t in binds) + ENTER
    return ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", enter, host, *argv]


def host_env(home: Path, **env: str) -> dict[str, str]:
    """This environment with ``home`` as the home directory and the ledger at hpctrain's default path in it (no
    HPCTRAIN_LEDGER), plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if k != LEDGER_ENV}, "HOME": str(home), **env}
