"""Values a cron line cannot carry, in the sweep tick's entry (`hpctrain sweep cron`, `sweep install-tick`): a line
break or separator (cron ends a line at "\\n", other readers at \\r \\v \\f \\x1c-\\x1e \\x85 U+2028 U+2029 too), another
control or format character, bytes that are not UTF-8, in the working directory, --log, --site or a variable carried
to the tick. Each is refused in one line naming the value and where it came from, and no table changes; every other
value (quotes, blanks, %, $, markup) goes in quoted, as one line. Property tests draw them; a few go through the CLI."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.errors import ConfigError
from hpctrain.sweep.cron import CARRIED, carried, crontab_line, scrontab_entry
from hpctrain.sweep.install import BEGIN, END, merged

from helpers.bad_input import examples
from helpers.cli import HPCTRAIN
from helpers.paths import REPO

pytestmark = pytest.mark.timeout(180)

SEPARATORS = ["\n", "\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]
CONTROLS = ["\x00", "\t", "\x1b", "\x07", "\x7f", "\x9b", "\u200b", "\u202e", "\ufeff"]
MARKUP = ["[bold]", "[/]", "$(id)", "`id`", "'", '"', "%", "\\", "#", " ", ";", "&", "|", "~", "*", "\u00a0", "日本",
          "* * * * * touch /tmp/marker #", "MAILTO=x", "SHELL=/bin/bash", BEGIN, END, "#SCRON --time=1"]
piece = st.one_of(st.sampled_from(SEPARATORS), st.sampled_from(CONTROLS), st.sampled_from(MARKUP),
                  st.text(max_size=3), st.binary(min_size=1, max_size=3).map(os.fsdecode))
value = st.lists(piece, max_size=4).map("".join)
# A user's own lines: anything but a line feed, and no marker line.
user_line = value.map(lambda v: v.replace("\n", "")).filter(lambda v: v.strip() not in (BEGIN, END))


def unsafe(text: str) -> bool:
    """What no value may bring into a cron line: a character of a category a line cannot carry."""
    return any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp") for c in text)


@examples(300)
@given(table=st.sampled_from(["crontab", "scrontab"]), workdir=value, log=value, site=st.none() | value.filter(bool),
       environ=st.dictionaries(st.sampled_from([*CARRIED, "DATA_ROOT"]), value, max_size=3),
       lines=st.lists(user_line, max_size=4), final=st.booleans())
def test_every_value_is_refused_in_one_line_or_gives_the_users_lines_and_one_entry(
        table, workdir, log, site, environ, lines, final):
    env = carried(environ, {"DATA_ROOT"})
    values = [str(Path(f"/{workdir}")), str(Path(f"/{log}")), site or "", *env.values(), sys.executable]
    try:
        if table == "crontab":
            entry = crontab_line(5, Path(f"/{workdir}"), Path(f"/{log}"), site, env)
        else:
            entry = scrontab_entry(5, Path(f"/{workdir}"), Path(f"/{log}"), site, env)
    except ConfigError as exc:
        message = str(exc)
        assert unsafe("".join(values)), message
        assert len(message.splitlines()) == 1 and not unsafe(message), message
        assert message.startswith(("the working directory ", "--log ", "--site ", "$")), message
        assert any(f" {v!r} holds U+" in message for v in values if unsafe(v)), message
        return
    assert not unsafe("".join(values))
    user = "".join(f"{line}\n" for line in lines) if final else "\n".join(lines)  # maybe without a last "\n"
    written = merged(user, entry).split("\n")
    assert written.pop() == ""  # the table ends with a line break
    start = written.index(BEGIN)
    block = written[start:]
    assert block[-1] == END and len(block) == (3 if table == "crontab" else 4)
    assert all(len(line.splitlines()) == 1 and not unsafe(line) for line in block), block
    mine = user.split("\n")[:-1] if user.endswith("\n") else user.split("\n") if user else []
    assert written[:start] == (mine + [""] if mine and mine[-1] else mine)  # a blank line sets the block apart
    # Taken out again, with the blank line before it (a blank line of the user's there is taken for that one).
    kept = mine[:-1] if mine and not mine[-1] else mine
    assert merged("\n".join(written) + "\n", None) == "".join(f"{line}\n" for line in kept)
    # Read by a shell (cron first turns "\\%" into "%"), the command has each value whole in a word of its own.
    command = block[-2].split(" ", 5)[5]
    words = shlex.split(command.replace("\\%", "%") if table == "crontab" else command)
    assert values[0] in words and f">>{values[1]}" in words and (site is None or f"{site};" in words)
    assert all(f"{name}={v}" in words for name, v in env.items())


@pytest.fixture
def tables(tmp_path: Path) -> Path:
    """A user's crontab and scrontab kept in files by stand-ins of the two commands (on PATH in `run`)."""
    bin_dir, tables = tmp_path / "bin", tmp_path / "tables"
    bin_dir.mkdir()
    tables.mkdir()
    for command in ("crontab", "scrontab"):
        (bin_dir / command).write_text(f'#!/bin/sh\ncase "$1" in -l) cat "{tables}/{command}" ;; *) cp "$1" '
                                       f'"{tables}/{command}" ;; esac\n')
        (bin_dir / command).chmod(0o755)
        (tables / command).write_text("MAILTO=me@example.org\n0 3 * * * /usr/local/bin/backup\n")
    return tables


def run(tmp_path: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, **env, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run([*HPCTRAIN, "sweep", *args], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=120)


def hostile_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir(parents=True)
    return folder


@pytest.mark.parametrize("table", ["crontab", "scrontab"])
def test_the_reported_working_directory_is_refused_and_no_table_changes(tables, tmp_path, table):
    """57.1's repro: before, the dry run showed a second entry (and installed, it ran)."""
    hostile = hostile_folder(tmp_path, "x\n* * * * * touch /tmp/marker #")
    before = {t.name: t.read_bytes() for t in tables.iterdir()}
    for args in (["install-tick", f"--{table}", "--dry-run"], ["install-tick", f"--{table}"], ["cron"]):
        done = run(tmp_path, hostile, *args)
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert done.stderr == (f"hpctrain: error: the working directory {str(hostile)!r} holds U+000A (a line "
                               "break, separator or control character), which a cron or scrontab line cannot carry: "
                               "use one without it\n")
    assert {t.name: t.read_bytes() for t in tables.iterdir()} == before


@pytest.mark.parametrize(("separator", "source"), [
    ("\r", "log"), ("\x85", "site"), ("\u2028", "carried"), ("\x1e", "working directory"), ("\x1b", "carried"),
])
def test_each_source_of_a_value_is_named_and_no_table_changes(tables, tmp_path, separator, source):
    before = {t.name: t.read_bytes() for t in tables.iterdir()}
    cwd, args, env = tmp_path, [], {}
    bad = f"/tmp/x{separator}* * * * * touch /tmp/marker #"
    if source == "log":
        args, where = ["--log", bad], "--log"
    elif source == "site":
        site = hostile_folder(tmp_path, f"x{separator}y") / "site.toml"
        site.write_text((REPO / "site_configs" / "dev.toml").read_text())
        bad, args, where = str(site), ["--site", str(site)], "--site"
    elif source == "carried":
        env, where = {"HPCTRAIN_LEDGER": bad}, "$HPCTRAIN_LEDGER (carried to the tick)"
    else:
        cwd = hostile_folder(tmp_path, f"x{separator}y")
        bad, where = str(cwd), "the working directory"
    for table in ("crontab", "scrontab"):
        done = run(tmp_path, cwd, "install-tick", f"--{table}", *args, **env)
        assert done.returncode == 2 and done.stdout == "", done.stdout
        assert done.stderr == (f"hpctrain: error: {where} {bad!r} holds U+{ord(separator):04X} (a line break, "
                               "separator or control character), which a cron or scrontab line cannot carry: use "
                               "one without it\n")
    assert {t.name: t.read_bytes() for t in tables.iterdir()} == before


def test_a_working_directory_of_other_odd_characters_goes_in_as_one_line(tables, tmp_path):
    odd = hostile_folder(tmp_path, "it's a 100% $HOME `dir` [bold] # 日本")
    done = run(tmp_path, odd, "install-tick", "--crontab")
    assert done.returncode == 0, done.stderr
    written = (tables / "crontab").read_text().split("\n")
    command = written[-3].split(" ", 5)[5]
    assert written[-4] == BEGIN and written[-2] == END and str(odd) in shlex.split(command.replace("\\%", "%"))
