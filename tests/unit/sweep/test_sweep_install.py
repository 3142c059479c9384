"""`hpctrain sweep install-tick`: the tick's entry written between marker lines of the user's crontab or scrontab,
replaced when run again and taken out by --remove, every other line kept byte for byte (lines as cron reads them:
ended by "\n" only); shown and not written with --dry-run; a table whose marker lines do not pair up left alone.
Here the two commands are stand-ins keeping the table in a file; one test uses this host's own crontab where it has
one (giving it back as it was); the cluster test tests/cluster/test_scrontab_cluster.py uses Slurm's scrontab and its
ticks. Values a cron line cannot carry: test_bad_tick_entry.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.sweep import install
from hpctrain.sweep.install import BEGIN, END, merged

from helpers.cli import HPCTRAIN
from helpers.paths import REPO
from helpers.sweep import kept_table

OTHERS = "MAILTO=me@example.org\n0 3 * * * /usr/local/bin/backup\n"
# What crontab and scrontab do with a table: -l prints it ("no crontab for USER" and status 1 before the first write),
# FILE replaces it.
TABLE_COMMAND = """#!/bin/sh
table="$TABLES/$(basename "$0")"
case "$1" in
  -l) [ -f "$table" ] || { echo "no crontab for $(id -un)" >&2; exit 1; }; cat "$table" ;;
  -*) echo "$(basename "$0"): error: unknown option $1" >&2; exit 1 ;;
  *) cp "$1" "$table" ;;
esac
"""


def test_the_block_is_replaced_or_taken_out_and_the_rest_kept():
    once = merged(OTHERS, "A\nB")
    assert once == f"{OTHERS}\n{BEGIN}\nA\nB\n{END}\n"
    assert merged(once, "C") == f"{OTHERS}\n{BEGIN}\nC\n{END}\n" == merged(merged(once, "X"), "C")
    assert merged(once, None) == OTHERS and merged("", None) == "" and merged(merged("", "A"), None) == ""
    edited = once.replace(f"{END}\n", f"{END}\n15 * * * * later\n")  # a line the user added after the block
    assert merged(edited, None) == f"{OTHERS}15 * * * * later\n"


# A user's lines that other readers split (str.splitlines, universal newlines) and cron does not: each one line.
ODD = "MAILTO=me\r\n0 3 * * * a\x85b\u2028c\vd\fe\x1cf\x1dg\x1eh\u2029i\r\n# \u00e9t\u00e9\n"


def test_the_table_is_split_at_line_feeds_only_and_the_users_lines_kept():
    once = merged(ODD, "E")
    assert once == f"{ODD}\n{BEGIN}\nE\n{END}\n"
    assert merged(once, None) == ODD and merged(merged(once, "F"), None) == ODD
    assert merged("no line break at the end", "E") == f"no line break at the end\n\n{BEGIN}\nE\n{END}\n"


# Tables whose marker lines do not pair up, by how (56.14: the END line edited, if only by a trailing blank).
UNPAIRED = {
    "END edited": (f"{BEGIN}\nA\n{END} \n15 * * * * later\n", "BEGIN on line 1, END on none; line 3 differs"),
    "BEGIN edited": (f" {BEGIN}\nA\n{END}\n", "BEGIN on none, END on line 3; line 1 differs"),
    "BEGIN alone": (f"{OTHERS}{BEGIN}\nA\n", "BEGIN on line 3, END on none)"),
    "END alone": (f"A\n{END}\nB\n", "BEGIN on none, END on line 2)"),
    "END first": (f"{END}\nA\n{BEGIN}\n", "BEGIN on line 3, END on line 1)"),
    "two BEGINs": (f"{BEGIN}\nA\n{BEGIN}\nB\n{END}\n", "BEGIN on lines 1, 3, END on line 5)"),
    "two blocks": (f"{BEGIN}\nA\n{END}\n{BEGIN}\nB\n{END}\n", "BEGIN on lines 1, 4, END on lines 3, 6)"),
    "a marker in a line": (f"{BEGIN}\nA\n{END}\r\n", "BEGIN on line 1, END on none; line 3 differs"),
}


@pytest.mark.parametrize("entry", ["E", None])
@pytest.mark.parametrize("name", list(UNPAIRED))
def test_a_table_whose_markers_do_not_pair_up_is_refused(name, entry):
    text, found = UNPAIRED[name]
    with pytest.raises(ConfigError) as raised:
        merged(text, entry)
    assert str(raised.value).startswith("the sweep tick's marker lines do not pair up (")
    assert found in str(raised.value) and len(str(raised.value).splitlines()) == 1


@pytest.fixture
def tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """crontab and scrontab stand-ins (`install_tick` puts them on PATH); their tables are files in this folder."""
    bin_dir, tables = tmp_path / "bin", tmp_path / "tables"
    bin_dir.mkdir()
    tables.mkdir()
    for command in ("crontab", "scrontab"):
        (bin_dir / command).write_text(TABLE_COMMAND)
        (bin_dir / command).chmod(0o755)
    monkeypatch.setenv("TABLES", str(tables))
    return tables


def install_tick(tmp_path: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run([*HPCTRAIN, "sweep", "install-tick", *args], cwd=cwd or tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("table", ["crontab", "scrontab"])
def test_install_tick_writes_replaces_and_takes_out_its_entry(tables, tmp_path, table):
    (tables / table).write_text(OTHERS)
    log = tmp_path / "tick.log"
    shown = install_tick(tmp_path, f"--{table}", "--log", str(log), "--dry-run")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"# {table} as it would be written (nothing changed):\n{OTHERS}\n{BEGIN}\n")
    assert (tables / table).read_text() == OTHERS
    done = install_tick(tmp_path, f"--{table}", "--log", str(log))
    assert done.returncode == 0 and "every active sweep ticks every 5 min" in done.stdout, done.stderr
    written = (tables / table).read_text()
    assert written == shown.stdout.split("\n", 1)[1]
    entry = written[len(OTHERS) + 1:].splitlines()[1:-1]
    assert entry[-1].startswith("*/5 * * * * ") and f"{sys.executable} -m hpctrain sweep tick;" in entry[-1]
    assert f"cd {tmp_path} &&" in entry[-1] and f">>{log} 2>&1" in entry[-1]
    if table == "scrontab":
        assert entry[0] == "#SCRON --job-name=hpctrain-sweep-tick --ntasks=1 --cpus-per-task=1 --time=10"
    else:
        assert len(entry) == 1
    again = install_tick(tmp_path, f"--{table}", "--log", str(log), "--every", "1")
    assert again.returncode == 0 and (tables / table).read_text().count(BEGIN) == 1
    assert (tables / table).read_text().splitlines()[-2].startswith("* * * * * ")
    same = install_tick(tmp_path, f"--{table}", "--log", str(log), "--every", "1")
    assert same.stdout == f"{table}: already with this tick entry; nothing changed\n"
    removed = install_tick(tmp_path, f"--{table}", "--remove")
    assert removed.returncode == 0 and removed.stdout == f"{table}: the sweep tick's entry taken out\n"
    assert (tables / table).read_text() == OTHERS


def test_a_first_table_is_written_and_the_scrontab_options_go_on_the_scron_line(tables, tmp_path):
    done = install_tick(tmp_path, "--scrontab", "--scron-option=--partition=cpu", "--scron-option", "--time=5")
    assert done.returncode == 0, done.stderr
    assert (tables / "scrontab").read_text().splitlines()[1] == (
        "#SCRON --job-name=hpctrain-sweep-tick --ntasks=1 --cpus-per-task=1 --time=10 --partition=cpu --time=5")


@pytest.mark.parametrize(("args", "said"), [
    (["--scrontab", "--scron-option=--partition=cpu --qos=high"],
     "hpctrain: error: --scron-option '--partition=cpu --qos=high': give one sbatch option as --name or "
     "--name=value, without blanks"),
    (["--scrontab", "--scron-option=-p"],
     "hpctrain: error: --scron-option '-p': give one sbatch option as --name or --name=value, without blanks"),
    (["--scrontab", "--scron-option=--x=1\n* * * * * rm -rf ~"],
     "hpctrain: error: --scron-option '--x=1\\n* * * * * rm -rf ~': give one sbatch option as --name or "
     "--name=value, without blanks"),
    (["--scrontab", "--scron-option=--comment=a\x07\x1b[2J"],
     "hpctrain: error: --scron-option '--comment=a\\x07\\x1b[2J' holds U+0007 (a line break, separator or control "
     "character), which a cron or scrontab line cannot carry: use one without it"),
    (["--crontab", "--scron-option=--partition=cpu"], "Error: --scron-option is for the tick's job under --scrontab"),
    (["--crontab", "--every", "60"], "Error: Invalid value for '--every': 60 is not in the range 1<=x<=59."),
])
def test_bad_options_are_one_line_and_change_no_table(tables, tmp_path, args, said):
    done = install_tick(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.splitlines()[-1] == said, done.stderr
    assert list(tables.iterdir()) == []


def test_a_table_command_missing_here_is_one_line_naming_the_other(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:/nonexistent"}
    done = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--crontab", "--site", str(REPO / "site_configs" /
                           "dev.toml")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == (
        "hpctrain: error: crontab: command not found on this host: install it, or use --scrontab\n")


def test_the_entry_carries_the_variables_the_site_config_refers_to(tables, tmp_path, monkeypatch):
    """Cron and scrontab give the tick little of this shell's environment: a site config's ${VAR:-default} would
    resolve to its default there (the dev site's slurm.conf of another cluster). Only what its paths expand, and
    the state folder (where the ledger's probe records are)."""
    site = tmp_path / "site.toml"
    site.write_text("# paths below may use $SECRET_TOKEN's folder\n" + (REPO / "site_configs" / "dev.toml").read_text())
    monkeypatch.setenv("HPCTRAIN_DEV_ROOT", "/var/tmp/dev root")
    monkeypatch.setenv("SECRET_TOKEN", "tok-1f2e")  # named in a comment only: no path expands it, none carries it
    monkeypatch.delenv("HPCTRAIN_SITE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))  # the ledger's probe records (issue 60)
    done = install_tick(tmp_path, "--scrontab", "--site", str(site))
    assert done.returncode == 0, done.stderr
    command = (tables / "scrontab").read_text().splitlines()[2]
    assert " HPCTRAIN_DEV_ROOT='/var/tmp/dev root' " in command and "HPCTRAIN_SITE_DIR" not in command
    assert f" XDG_STATE_HOME={tmp_path / 'state'} " in command
    assert "tok-1f2e" not in (tables / "scrontab").read_text()
    assert f"sweep tick --site {site};" in command


@pytest.mark.parametrize("args", [["--crontab"], ["--scrontab", "--every", "1"], ["--crontab", "--remove"]])
def test_an_edited_end_marker_leaves_the_table_as_it_was(tables, tmp_path, args):
    """56.14: the END line with a trailing blank; before, everything after BEGIN went, the user's later lines too."""
    table = args[0][2:]
    text = f"{OTHERS}\n{BEGIN}\n*/5 * * * * old tick\n{END} \n15 * * * * later\n"
    (tables / table).write_text(text)
    done = install_tick(tmp_path, *args)
    assert done.returncode == 2 and done.stdout == "" and done.stderr == (
        f"hpctrain: error: {table}: the sweep tick's marker lines do not pair up (BEGIN on line 4, END on none; "
        f"line 6 differs from a marker only in blanks): mend them with `{table} -e`; nothing changed\n")
    assert (tables / table).read_text() == text


def test_a_users_lines_keep_their_bytes_through_install_and_remove(tables, tmp_path):
    """Read and written as bytes: a carriage return stays in its line, bytes that are not UTF-8 stay as they were."""
    text = ODD.encode() + b"# caf\xe9 (Latin-1)\n"
    (tables / "crontab").write_bytes(text)
    shown = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--crontab", "--dry-run"], cwd=tmp_path, timeout=120,
                           env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}, capture_output=True)
    assert shown.returncode == 0, shown.stderr
    done = install_tick(tmp_path, "--crontab")
    assert done.returncode == 0, done.stderr
    assert (tables / "crontab").read_bytes().startswith(text + b"\n" + BEGIN.encode() + b"\n")
    assert shown.stdout.split(b"\n", 1)[1] == (tables / "crontab").read_bytes()
    assert install_tick(tmp_path, "--crontab", "--remove").returncode == 0
    assert (tables / "crontab").read_bytes() == text


@pytest.fixture
def own_crontab():
    """This host's crontab (the user's), given back as it was after the test."""
    with kept_table("crontab", "no crontab command on this host"):
        yield


def test_the_real_crontab_keeps_its_lines_through_a_hostile_working_directory(own_crontab, tmp_path):
    """With this host's crontab: a working directory that would have added a cron entry of its own is refused and
    changes nothing; one with quotes, blanks, % and $ goes in as one quoted line, and out again."""
    mine = "MAILTO=\"\"\n# hpctrain test: a user's line\n17 4 * * * true\n"
    install.write("crontab", mine)
    hostile = tmp_path / "x\n* * * * * touch /tmp/hpctrain-marker #"
    hostile.mkdir(parents=True)
    refused = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--crontab"], cwd=hostile, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert install.read("crontab") == mine
    odd = tmp_path / "it's a 100% $HOME `dir`"
    odd.mkdir()
    done = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--crontab"], cwd=odd, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    listed = subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=True).stdout
    assert listed.startswith(f"{mine}\n{BEGIN}\n") and listed.endswith(f"{END}\n")
    assert len(listed.split("\n")) == len(mine.split("\n")) + 4 and "\\%" in listed
    removed = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--crontab", "--remove"], cwd=odd,
                             capture_output=True, text=True, timeout=120)
    assert removed.returncode == 0, removed.stderr
    assert subprocess.run(["crontab", "-l"], capture_output=True, text=True, check=True).stdout == mine
