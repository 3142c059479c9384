"""A Slurm configuration file that is named (the site's slurm.conf, else $SLURM_CONF) but missing is said at once,
as one line naming it and who named it: Slurm's commands would retry it for a minute, and hpctrain said "no answer
within 30s (is slurmctld up?)". Without one named, Slurm finds its own (its default, a configless copy), so hpctrain
runs the command. Stub Slurm commands record each run: none must run where the file is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.errors import SlurmError
from hpctrain.slurm.client import CLIENT_COMMANDS, SlurmClient

from helpers.cli import run_cli
from helpers.paths import REPO

DEV_CONF = 'conf = "${HPCTRAIN_DEV_ROOT:-/var/tmp/hpctrain-dev}/etc/slurm.conf"'


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    """A bin_dir of Slurm commands that record their run in ``ran`` and answer 'UP' at once."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for cmd in CLIENT_COMMANDS:
        (bin_dir / cmd).write_text(f'#!/bin/sh\necho {cmd} >> {tmp_path / "ran"}\necho UP\n')
        (bin_dir / cmd).chmod(0o755)
    return bin_dir


def site_file(tmp_path: Path, conf: Path | None, bin_dir: Path) -> Path:
    """The dev site with ``conf`` as its slurm.conf (None: none named) and the stubs as its Slurm commands."""
    named = f'conf = "{conf}"\n' if conf else ""
    path = tmp_path / "site.toml"
    path.write_text((REPO / "site_configs" / "dev.toml").read_text().replace(DEV_CONF, f'{named}bin_dir = "{bin_dir}"'))
    return path


def test_a_missing_site_slurm_conf_is_said_before_any_command(tmp_path, stubs, monkeypatch):
    missing = tmp_path / "etc" / "slurm.conf"
    monkeypatch.setenv("SLURM_CONF", str(REPO / "README.md"))  # the site's wins over the environment's
    with pytest.raises(SlurmError) as err:
        SlurmClient(missing, stubs).ping()
    assert str(err.value) == f"scontrol: Slurm's configuration file {missing} (the site config's slurm.conf) does not exist"
    assert not (tmp_path / "ran").exists()


def test_a_missing_slurm_conf_from_the_environment_is_named_so(tmp_path, stubs, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nowhere.conf"))
    with pytest.raises(SlurmError, match=rf"^sacct: Slurm's configuration file {tmp_path}/nowhere.conf \(\$SLURM_CONF\) "
                                         r"does not exist$"):
        SlurmClient(bin_dir=stubs).sacct(["1"], ("JobID",))
    assert not (tmp_path / "ran").exists()


def test_without_a_file_named_slurm_finds_its_own(tmp_path, stubs, monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert SlurmClient(bin_dir=stubs).ping() == "UP"
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    assert SlurmClient(conf, stubs).ping() == "UP"
    assert (tmp_path / "ran").read_text().split() == ["scontrol", "scontrol"]


def test_doctor_fails_the_controller_check_at_once(tmp_path, stubs):
    missing = tmp_path / "etc" / "slurm.conf"
    done = run_cli("doctor", "--site", str(site_file(tmp_path, missing, stubs)), "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)}
    assert checks["controller"] == {"name": "controller", "verdict": "FAIL", "detail": (
        f"scontrol: Slurm's configuration file {missing} (the site config's slurm.conf) does not exist")}
    assert not (tmp_path / "ran").exists()


def test_a_dry_run_says_it_in_one_line(tmp_path, stubs, isolated_ledger):
    missing = tmp_path / "etc" / "slurm.conf"
    spec = tmp_path / "job.toml"
    spec.write_text('name = "j"\ncommand = ["true"]\nlauncher = "none"\n')
    done = run_cli("submit", str(spec), "--site", str(site_file(tmp_path, missing, stubs)), "--dry-run")
    assert done.returncode == 2 and done.stdout == "", done.stdout
    assert done.stderr.startswith("hpctrain: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.endswith(f": Slurm's configuration file {missing} (the site config's slurm.conf) does not exist\n")
    assert not (tmp_path / "ran").exists()
