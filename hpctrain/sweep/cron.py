"""The cron entry of sweep ticks for this installation of hpctrain (`hpctrain sweep cron` prints it)."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from pathlib import Path

from hpctrain.contract import LOGIN_ENV
from hpctrain.slurm import CONF_ENV

# What a tick run here has that cron would not give it: cron starts commands with PATH=/usr/bin:/bin and little else.
CARRIED = ("PATH", CONF_ENV, *LOGIN_ENV)


def crontab_line(every_minutes: int, workdir: Path, log: Path, site: str | None, environ: Mapping[str, str]) -> str:
    """A crontab line: every ``every_minutes``, in ``workdir``, this interpreter's hpctrain ticks every active sweep
    with the CARRIED variables of ``environ``, appending to ``log`` one line before (the time) and after (the exit
    status) each tick's output, as scripts/sweep-tick-cron does. Ticks that overlap take turns on the lock beside
    the ledger."""
    q = shlex.quote
    log = log.expanduser().absolute()
    env = [f"{name}={q(environ[name])}" for name in CARRIED if environ.get(name)]
    tick = shlex.join([sys.executable, "-m", "hpctrain", "sweep", "tick", *(["--site", site] if site else [])])
    command = (
        f'mkdir -p {q(str(log.parent))} && cd {q(str(workdir))} && {{ echo "== $(date -Is) sweep tick"; '
        f'{" ".join([*env, tick])}; echo "== exit $?"; }} >>{q(str(log))} 2>&1'
    )
    return f"*/{every_minutes} * * * * " + command.replace("%", "\\%")  # cron reads a bare % as a newline
