"""hpctrain as users install it: a wheel built from the repository, in a fresh venv away from the source
tree, on every Python the login node may have; each extra resolved by pip on every Python it is claimed for;
and login-node commands that never import torch. A job submitted from the wheel runs in
tests/cluster/test_packaging_cluster.py (helpers.wheels; the fixtures are in tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hpctrain.cli import EXTRA_PYTHON

from helpers.paths import REPO
from helpers.wheels import PICK_PYTHON, PYTHONS, SPEC, TORCH_EXTRAS, Resolution, claimed, hpctrain, metadata


def version_of(python: Path | str) -> tuple[int, int]:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True,
                         check=True).stdout
    major, minor = map(int, out.split())
    return major, minor


def requirements(wheel: Path, extra: str, version: str) -> set[str]:
    """The names of what the wheel's METADATA lists for ``extra`` on Python ``version``."""
    return {canonicalize_name(r.name) for r in map(Requirement, metadata(wheel).get_all("Requires-Dist"))
            if r.marker and "extra" in str(r.marker) and r.marker.evaluate({"extra": extra, "python_version": version})}


def claimed_run(resolutions: dict[str, dict[str, Resolution]], version: str) -> tuple[list[str], dict[str, dict]]:
    """The extras resolved together on Python ``version`` and what pip would install."""
    if version not in resolutions:
        pytest.skip(f"no Python {version} on this machine")
    run = resolutions[version]["claimed"]
    rc, err, installs = run.result()
    assert rc == 0, err[-3000:]
    return run.extras, installs


def test_the_wheel_carries_the_site_configs(login_install, tmp_path):
    """(Its templates render a job in tests/cluster/test_packaging_cluster.py: a dry run checks the user's
    accounts with Slurm.)"""
    site = subprocess.run([login_install / "python", "-c", "from hpctrain.config.site import find_site_file; "
                           "print(find_site_file('dev'))"], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert "_bundled/site_configs/dev.toml" in site.stdout and str(REPO) not in site.stdout


def test_the_wheel_carries_the_license_and_the_examples_and_prints_its_own_cron_line(login_install, wheel, tmp_path):
    with zipfile.ZipFile(wheel) as z:
        (license_file,) = [n for n in z.namelist() if ".dist-info/" in n and n.endswith("/LICENSE")]
        assert "Apache License" in z.read(license_file).decode()
    assert "LICENSE" in metadata(wheel).get_all("License-File")
    done = hpctrain(login_install, "examples", "work", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    copied = tmp_path / "work" / "scripts" / "examples"
    source = REPO / "scripts" / "examples"
    assert sorted(p.name for p in copied.iterdir()) == sorted(p.name for p in source.iterdir() if p.is_file())
    assert (copied / "sweep-quadratic.toml").read_text() == (source / "sweep-quadratic.toml").read_text()
    cron = hpctrain(login_install, "sweep", "cron", cwd=copied.parent.parent, HPCTRAIN_LEDGER=str(tmp_path / "l.db"))
    assert cron.returncode == 0, cron.stderr
    assert f"cd {copied.parent.parent} && " in cron.stdout and f"HPCTRAIN_LEDGER={tmp_path / 'l.db'} " in cron.stdout
    assert f" {login_install / 'python'} -m hpctrain sweep tick;" in cron.stdout


def test_a_command_that_needs_the_compute_stack_names_the_extra(login_install, tmp_path):
    done = hpctrain(login_install, "ckpt", "ls", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("hpctrain: error: `hpctrain ckpt` needs ") and done.stderr.count("\n") == 1
    assert "pip install 'hpctrain[ckpt]'" in done.stderr
    version = version_of(login_install / "python")
    assert ("(on Python 3.11 or newer: this is 3.10" in done.stderr) == (version < EXTRA_PYTHON["ckpt"])


@pytest.mark.parametrize("version", PYTHONS)
def test_each_extra_without_torch_resolves_on_each_python_it_is_claimed_for(resolutions, wheel, version):
    """Each of its requirements is in what pip would install: none is dropped by a marker (an extra installing
    nothing there), and the extras resolve together, so each alone does."""
    resolved, installs = claimed_run(resolutions, version)
    extras = [e for e in metadata(wheel).get_all("Provides-Extra") if claimed(e, version) and e not in TORCH_EXTRAS]
    assert extras and set(extras) <= set(resolved)
    for extra in extras:
        assert requirements(wheel, extra, version) <= set(installs), extra
    assert ("torch" in installs) == bool(set(resolved) & set(TORCH_EXTRAS))  # only the TORCH_EXTRAS pull it in


@pytest.mark.parametrize("version", PYTHONS)
def test_each_extra_with_torch_resolves_with_the_local_torch_wheel_where_there_is_one(resolutions, wheel, version):
    resolved, installs = claimed_run(resolutions, version)
    extras = [e for e in TORCH_EXTRAS if claimed(e, version)]
    if not set(extras) <= set(resolved):
        pytest.skip(f"no local torch {PICK_PYTHON['TORCH']} wheel for Python {version} in pip's find-links: resolving "
                    f"{', '.join(extras)} would download the multi-GB CUDA build")
    for extra in extras:
        assert requirements(wheel, extra, version) <= set(installs), extra
    assert installs["torch"]["download_info"]["url"].startswith("file:")


def test_extras_claimed_only_for_newer_pythons_are_refused_by_pip_on_older_ones(resolutions, wheel):
    """Loudly: pip says which Python they need. An extra that pulls torch (and resolving it would download torch
    first) holds every requirement of one that does not and is refused (train and all hold ckpt)."""
    refused = 0
    for version, runs in resolutions.items():
        for extra in metadata(wheel).get_all("Provides-Extra"):
            if claimed(extra, version):
                continue
            if extra in TORCH_EXTRAS:
                assert any(requirements(wheel, alone, version) <= requirements(wheel, extra, version)
                           for alone in runs if alone != "claimed"), (version, extra)
                continue
            rc, err, _ = runs[extra].result()
            assert rc != 0 and "Requires-Python >=3.11" in err, (version, extra, err[-2000:])
            refused += 1
    assert refused or "3.10" not in resolutions


@pytest.mark.parametrize("args", [("ckpt", "ls"), ("ckpt", "verify"), ("ckpt", "inspect"), ("data", "verify")])
def test_login_node_commands_never_import_torch(args, tmp_path):
    from hpctrain.checkpoint import Checkpointer

    from helpers.data import make_dataset

    with Checkpointer(tmp_path / "ck", journal=None) as ck:
        ck.save(1, {"w": __import__("numpy").ones(4)})
    target = {"ls": tmp_path / "ck", "verify": tmp_path / "ck", "inspect": tmp_path / "ck" / "step_00000001"}
    path = make_dataset(tmp_path / "data", 8, 4).path if args[0] == "data" else target[args[1]]
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpctrain", *args, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "webdataset" not in imported
