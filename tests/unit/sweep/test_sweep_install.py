"""`hpctrain sweep install-tick`: the tick's entry written between marker lines of the user's crontab or scrontab,
replaced when run again and taken out by --remove, every other line kept; shown and not written with --dry-run.
Here the two commands are stand-ins keeping the table in a file (never this machine's own crontab); the cluster test
tests/cluster/test_scrontab_cluster.py uses Slurm's scrontab and its ticks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.sweep.install import BEGIN, END, merged

from helpers.cli import HPCTRAIN
from helpers.paths import REPO

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


def install_tick(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
    return subprocess.run([*HPCTRAIN, "sweep", "install-tick", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)


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
    resolve to its default there (the dev site's slurm.conf of another cluster). Only what its paths expand."""
    site = tmp_path / "site.toml"
    site.write_text("# paths below may use $SECRET_TOKEN's folder\n" + (REPO / "site_configs" / "dev.toml").read_text())
    monkeypatch.setenv("HPCTRAIN_DEV_ROOT", "/var/tmp/dev root")
    monkeypatch.setenv("SECRET_TOKEN", "tok-1f2e")  # named in a comment only: no path expands it, none carries it
    monkeypatch.delenv("HPCTRAIN_SITE_DIR", raising=False)
    done = install_tick(tmp_path, "--scrontab", "--site", str(site))
    assert done.returncode == 0, done.stderr
    command = (tables / "scrontab").read_text().splitlines()[2]
    assert " HPCTRAIN_DEV_ROOT='/var/tmp/dev root' " in command and "HPCTRAIN_SITE_DIR" not in command
    assert "tok-1f2e" not in (tables / "scrontab").read_text()
    assert f"sweep tick --site {site};" in command
