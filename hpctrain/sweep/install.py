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
    """``text`` with its marked block replaced by ``entry`` (or taken out, for None; appended where it had none).
    Lines are what cron reads: ended by "\n" only. A table whose marker lines do not pair up is refused."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the table's last line break (or an empty table)
    block = _block(lines)
    if block is not None:
        start, end = block
        del lines[start : end + 1]
        if start and not lines[start - 1]:
            del lines[start - 1]  # the blank line that set the block apart
    if entry is not None:
        if lines and lines[-1]:
            lines.append("")
        lines += [BEGIN, *entry.split("\n"), END]
    return "".join(f"{line}\n" for line in lines)


def _block(lines: list[str]) -> tuple[int, int] | None:
    """The indices of the BEGIN and END lines of ``lines``' block (None: it has none); ConfigError unless one BEGIN
    line and one END line, in that order, or neither, are there exactly as written (a marker line edited, if only
    by a blank, is not taken for one, nor left as a user's line)."""
    begins = [i for i, line in enumerate(lines) if line == BEGIN]
    ends = [i for i, line in enumerate(lines) if line == END]
    edited = [i for i, line in enumerate(lines) if line not in (BEGIN, END) and line.strip() in (BEGIN, END)]
    if not edited and not begins and not ends:
        return None
    if not edited and len(begins) == len(ends) == 1 and begins[0] < ends[0]:
        return begins[0], ends[0]
    found = f"BEGIN on {_numbers(begins)}, END on {_numbers(ends)}"
    if edited:
        found += f"; {_numbers(edited)} {'differ' if len(edited) > 1 else 'differs'} from a marker only in blanks"
    raise ConfigError(f"the sweep tick's marker lines do not pair up ({found})")


def _numbers(indices: list[int]) -> str:
    return f"line{'s' if len(indices) > 1 else ''} {', '.join(str(i + 1) for i in indices)}" if indices else "none"


def _run(table: Table, *args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run([table, *args], capture_output=True, timeout=60)
    except FileNotFoundError:
        other = "scrontab" if table == "crontab" else "crontab"
        raise ConfigError(f"{table}: command not found on this host: install it, or use --{other}") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{table}: no answer within 60 s") from None


def _complaint(table: Table, done: subprocess.CompletedProcess[bytes]) -> str:
    said = [line.strip() for line in (done.stderr or done.stdout).decode(errors="replace").split("\n") if line.strip()]
    return said[0].removeprefix(f"{table}: ").removeprefix("error: ") if said else f"exit status {done.returncode}"


def read(table: Table) -> str:
    """The user's table as it is now ("" if it was never written); bytes that are not UTF-8 read as surrogates
    (`write` writes them back as they were)."""
    done = _run(table, "-l")
    if done.returncode != 0:
        complaint = _complaint(table, done)
        if complaint.startswith(EMPTY):
            return ""
        raise ConfigError(f"{table} -l: {complaint}")
    return done.stdout.decode(errors="surrogateescape")


def write(table: Table, text: str) -> None:
    """Replace the user's table by ``text`` (both commands take a file)."""
    with tempfile.TemporaryDirectory(prefix="hpctrain-tick-") as tmp:
        path = Path(tmp) / "table"
        path.write_bytes(text.encode(errors="surrogateescape"))
        done = _run(table, str(path))
    if done.returncode != 0:
        raise ConfigError(f"{table}: {_complaint(table, done)}")


def change(table: Table, entry: str | None, dry_run: bool = False) -> Change:
    """Put ``entry`` in the user's ``table`` (None: take the tick's entry out); with ``dry_run`` only say how."""
    before = read(table)
    try:
        after = merged(before, entry)
    except ConfigError as exc:
        raise ConfigError(f"{table}: {exc}: mend them with `{table} -e`; nothing changed") from None
    if after != before and not dry_run:
        write(table, after)
    return Change(before, after)
