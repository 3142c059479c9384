"""The sweep tick's entry in the user's cron table: crontab's (run on this login node) or Slurm's scrontab (run as a
job on a compute node, at sites without a crontab on login nodes). The entry lies between two marker lines:
installing again replaces it, removing takes it out, and every other line of the table stays as it was."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from hpctrain.errors import ConfigError

Table = Literal["crontab", "scrontab"]
BEGIN = "# BEGIN hpctrain sweep tick (`hpctrain sweep install-tick` replaces what lies between these lines)"
END = "# END hpctrain sweep tick"
EMPTY = ("no crontab for",)  # what `crontab -l` and `scrontab -l` say of a table never written (exit status 1)


@dataclass(frozen=True)
class Change:
    """A table before and after (written only where they differ, and not for a dry run)."""

    before: str
    after: str


def default_table() -> Table:
    """crontab where this host has one, else scrontab."""
    return "crontab" if shutil.which("crontab") else "scrontab"


def merged(text: str, entry: str | None) -> str:
    """``text`` with its marked block replaced by ``entry`` (or taken out, for None; appended where it had none)."""
    lines = text.splitlines()
    if BEGIN in lines:
        start = lines.index(BEGIN)
        end = lines.index(END, start) if END in lines[start:] else len(lines) - 1
        del lines[start : end + 1]
        if start and not lines[start - 1]:
            del lines[start - 1]  # the blank line that set the block apart
    if entry is not None:
        if lines and lines[-1]:
            lines.append("")
        lines += [BEGIN, *entry.splitlines(), END]
    return "".join(f"{line}\n" for line in lines)


def _run(table: Table, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run([table, *args], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        other = "scrontab" if table == "crontab" else "crontab"
        raise ConfigError(f"{table}: command not found on this host: install it, or use --{other}") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{table}: no answer within 60 s") from None


def _complaint(table: Table, done: subprocess.CompletedProcess[str]) -> str:
    said = [line.strip() for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return said[0].removeprefix(f"{table}: ").removeprefix("error: ") if said else f"exit status {done.returncode}"


def read(table: Table) -> str:
    """The user's table as it is now ("" if it was never written)."""
    done = _run(table, "-l")
    if done.returncode != 0:
        complaint = _complaint(table, done)
        if complaint.startswith(EMPTY):
            return ""
        raise ConfigError(f"{table} -l: {complaint}")
    return done.stdout


def write(table: Table, text: str) -> None:
    """Replace the user's table by ``text`` (both commands take a file)."""
    with tempfile.TemporaryDirectory(prefix="hpctrain-tick-") as tmp:
        path = Path(tmp) / "table"
        path.write_text(text)
        done = _run(table, str(path))
    if done.returncode != 0:
        raise ConfigError(f"{table}: {_complaint(table, done)}")


def change(table: Table, entry: str | None, dry_run: bool = False) -> Change:
    """Put ``entry`` in the user's ``table`` (None: take the tick's entry out); with ``dry_run`` only say how."""
    before = read(table)
    after = merged(before, entry)
    if after != before and not dry_run:
        write(table, after)
    return Change(before, after)
