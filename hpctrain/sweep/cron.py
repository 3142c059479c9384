"""The sweep tick's entry for this installation of hpctrain: a crontab line (`hpctrain sweep cron` prints it), or a
scrontab entry, which Slurm runs as a job on a compute node (`hpctrain sweep install-tick` writes either)."""

from __future__ import annotations

import re
import shlex
import sys
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from hpctrain.contract import LOGIN_ENV
from hpctrain.errors import ConfigError
from hpctrain.slurm import CONF_ENV

# What a tick run here has that cron would not give it: cron starts commands with PATH=/usr/bin:/bin and little else,
# a scrontab job with what Slurm sets. The variables the site config refers to are carried too (`carried`), and the
# state folder where one is set: the ledger's probe records are there (`hpctrain.ledger.probes`), and a tick on a
# compute node that missed them would refuse a ledger on a network file system the user's doctor had accepted.
CARRIED = ("PATH", CONF_ENV, *LOGIN_ENV, "XDG_STATE_HOME")
# The tick's job under scrontab: one CPU for a few minutes (a tick takes seconds; while one runs, Slurm submits no next).
SCRON_DEFAULTS = ("--job-name=hpctrain-sweep-tick", "--ntasks=1", "--cpus-per-task=1", "--time=10")
# An sbatch option on a #SCRON line: one word, --name or --name=value (scrontab splits the line at blanks).
SCRON_OPTION = re.compile(r"--[a-z][a-z-]*(=[^\s]+)?")
# What no value may bring into a cron line, quoted or not: line breaks and separators (cron ends a line at "\n", other
# readers of the table at \r \v \f \x1c-\x1e \x85 U+2028 U+2029 too), other control and format (invisible)
# characters, and surrogates (bytes of a file name that are not UTF-8).
UNSAFE = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def schedule(every_minutes: int) -> str:
    """The five time fields of "every ``every_minutes`` minutes" (scrontab refuses a step of 1)."""
    return f"{'*' if every_minutes == 1 else f'*/{every_minutes}'} * * * *"


def carried(environ: Mapping[str, str], site_variables: Iterable[str]) -> dict[str, str]:
    """The variables of ``environ`` a tick needs: CARRIED, and those the site config's paths expanded
    (`hpctrain.config.loading.expanded_variables`), which would otherwise resolve to their defaults there (another
    cluster's slurm.conf, other data folders). Only these: a name in a comment or in other text stays out."""
    names = [*CARRIED, *sorted(site_variables)]
    return {name: environ[name] for name in dict.fromkeys(names) if environ.get(name)}


def line_safe(value: str, where: str) -> str:
    """``value``, refused in one line naming ``where`` (it came from there) if it holds an UNSAFE character."""
    bad = next((c for c in value if unicodedata.category(c) in UNSAFE), None)
    if bad is not None:
        raise ConfigError(
            f"{where} {value!r} holds U+{ord(bad):04X} (a line break, separator or control character), which a "
            "cron or scrontab line cannot carry: use one without it"
        )
    return value


def tick_command(workdir: Path, log: Path, site: str | None, env: Mapping[str, str]) -> str:
    """The shell command that runs, in ``workdir`` with the variables ``env`` (`carried`), this interpreter's hpctrain
    tick of every active sweep, appending to ``log`` one line before (the time) and after (the exit status) its
    output, as scripts/sweep-tick-cron does. Ticks that overlap take turns on the lock beside the ledger. A value that
    a cron line cannot carry (`line_safe`) is refused, naming where it came from."""
    q = shlex.quote
    log = Path(line_safe(str(log.expanduser().absolute()), "--log"))
    workdir = Path(line_safe(str(workdir), "the working directory"))
    assignments = [f"{name}={q(line_safe(value, f'${name} (carried to the tick)'))}" for name, value in env.items()]
    site_args = ["--site", line_safe(site, "--site")] if site else []
    interpreter = line_safe(sys.executable, "this interpreter's path")
    tick = shlex.join([interpreter, "-m", "hpctrain", "sweep", "tick", *site_args])
    return (
        f'mkdir -p {q(str(log.parent))} && cd {q(str(workdir))} && {{ echo "== $(date -Is) sweep tick"; '
        f'{" ".join([*assignments, tick])}; echo "== exit $?"; }} >>{q(str(log))} 2>&1'
    )


def crontab_line(every_minutes: int, workdir: Path, log: Path, site: str | None, env: Mapping[str, str]) -> str:
    """A crontab line: every ``every_minutes``, the ``tick_command``."""
    command = tick_command(workdir, log, site, env)
    return f"{schedule(every_minutes)} " + command.replace("%", "\\%")  # cron reads a bare % as a newline


def scrontab_entry(
    every_minutes: int,
    workdir: Path,
    log: Path,
    site: str | None,
    env: Mapping[str, str],
    options: Sequence[str] = (),
) -> str:
    """A scrontab entry: a #SCRON line of SCRON_DEFAULTS and ``options`` (sbatch's, e.g. --partition=cpu; later
    ones win), then every ``every_minutes`` the ``tick_command``, run by Slurm as a job on a compute node."""
    for option in options:
        if not SCRON_OPTION.fullmatch(option):
            raise ConfigError(
                f"--scron-option {option!r}: give one sbatch option as --name or --name=value, without blanks"
            )
        line_safe(option, "--scron-option")
    command = tick_command(workdir, log, site, env)
    return f"#SCRON {' '.join([*SCRON_DEFAULTS, *options])}\n{schedule(every_minutes)} {command}"
