"""hpctrain as users install it: a wheel built from the repository, in a fresh venv away from the source
tree, on every Python the login node may have; each extra resolved by pip on every Python it is claimed for;
and login-node commands that never import torch."""

from __future__ import annotations

import email.parser
import json
import os
import runpy
import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from hpctrain.cli import EXTRA_PYTHON

from conftest import REPO

LOGIN_PYTHONS = ("3.10", "3.12", "3.13")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")  # setup.cfg's classifiers
# Extras whose requirements pull torch (train pins it; accelerate and lightning depend on it). They are resolved
# with torch named as setup.cfg pins it, and only on a Python with a local torch wheel in pip's find-links:
# elsewhere pip would download the multi-GB CUDA build to read its metadata.
TORCH_EXTRAS = ("train", "hf", "lightning", "all")
PICK_PYTHON = runpy.run_path(str(REPO / "scripts" / "pick-python"))  # its TORCH and local_torch_tags()
SPEC = """\
name = "from-wheel"
command = ["python3", "-c", "print('ran from a wheel')"]
launcher = "none"
[resources]
mem = "100M"
time = "00:02:00"
"""


def interpreter(version: str) -> str | None:
    """A CPython of ``version`` on this machine: under pyenv or on PATH (where pyenv's shims may not run it)."""
    pyenv = sorted(Path("~/.pyenv/versions").expanduser().glob(f"{version}.*/bin/python{version}"))
    for candidate in [*map(str, pyenv), shutil.which(f"python{version}")]:
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the source: setuptools writes build/ and *.egg-info into the tree it builds, and the
    Slurm lanes' runs of this test (scripts/test) build from the same repository at the same time."""
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source") / "hpctrain"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                                "__pycache__", ".pytest_cache", "results"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
                   check=True, capture_output=True)
    (built,) = out.glob("hpctrain-*.whl")
    return built


def version_of(python: Path | str) -> tuple[int, int]:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True,
                         check=True).stdout
    major, minor = map(int, out.split())
    return major, minor


def claimed(extra: str, version: str) -> bool:
    """Whether the README and setup.cfg say ``extra`` installs on Python ``version`` (hpctrain's own hint too)."""
    return tuple(map(int, version.split("."))) >= EXTRA_PYTHON.get(extra, (3, 10))


def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as z:
        return email.parser.Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
                                              .decode())


def requirements(wheel: Path, extra: str, version: str) -> set[str]:
    """The names of what the wheel's METADATA lists for ``extra`` on Python ``version``."""
    return {canonicalize_name(r.name) for r in map(Requirement, metadata(wheel).get_all("Requires-Dist"))
            if r.marker and "extra" in str(r.marker) and r.marker.evaluate({"extra": extra, "python_version": version})}


class Resolution:
    """One `pip install --dry-run --report` of the wheel with some extras, by one Python's own pip, running."""

    def __init__(self, python: str, wheel: Path, extras: list[str], report: Path):
        self.extras, self.report = extras, report
        torch = [f"torch=={PICK_PYTHON['TORCH']}"] if set(extras) & set(TORCH_EXTRAS) else []
        self.proc = subprocess.Popen([python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                                      "--report", str(report), f"{wheel}[{','.join(extras)}]", *torch],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def result(self) -> tuple[int, str, dict[str, dict]]:
        """pip's exit status, its stderr, and what it would install by name (the report's entries)."""
        _, err = self.proc.communicate(timeout=600)
        installs = json.loads(self.report.read_text())["install"] if self.proc.returncode == 0 else []
        return self.proc.returncode, err, {canonicalize_name(i["metadata"]["name"]): i for i in installs}


@pytest.fixture(scope="session")
def resolutions(wheel, tmp_path_factory) -> dict[str, dict[str, Resolution]]:
    """Per Python on this machine: pip resolving every extra claimed for it together ("claimed"; those that pull
    torch only where a local torch wheel lets them), and each extra that pulls no torch and is not claimed for it,
    alone (by its name). They all run at once."""
    out = tmp_path_factory.mktemp("resolve")
    local = PICK_PYTHON["local_torch_tags"]()
    extras = metadata(wheel).get_all("Provides-Extra")
    found: dict[str, dict[str, Resolution]] = {}
    for version in PYTHONS:
        python = interpreter(version)
        if python is None:
            continue
        torch = f"cp{version.replace('.', '')}" in local
        found[version] = {"claimed": Resolution(python, wheel, [e for e in extras if claimed(e, version) and (
            torch or e not in TORCH_EXTRAS)], out / f"{version}.json")}
        found[version].update({e: Resolution(python, wheel, [e], out / f"{version}-{e}.json") for e in extras
                               if not claimed(e, version) and e not in TORCH_EXTRAS})
    yield found
    for runs in found.values():
        for run in runs.values():
            run.proc.kill()
            run.proc.wait()


def claimed_run(resolutions: dict[str, dict[str, Resolution]], version: str) -> tuple[list[str], dict[str, dict]]:
    """The extras resolved together on Python ``version`` and what pip would install."""
    if version not in resolutions:
        pytest.skip(f"no Python {version} on this machine")
    run = resolutions[version]["claimed"]
    rc, err, installs = run.result()
    assert rc == 0, err[-3000:]
    return run.extras, installs


@pytest.fixture(scope="session", params=LOGIN_PYTHONS)
def login_install(request, wheel, resolutions, tmp_path_factory) -> Path:
    """The wheel with its login-node dependencies only, in a venv of each Python: its bin directory. (The extras'
    resolutions start first, to run while the venvs are made.)"""
    python = interpreter(request.param)
    if python is None:
        pytest.skip(f"no Python {request.param} on this machine")
    venv = tmp_path_factory.mktemp(f"venv{request.param}")
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True)
    return venv / "bin"


def hpctrain(bin_dir: Path, *args: str, cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([bin_dir / "hpctrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def test_the_wheel_carries_the_templates_and_site_configs_and_renders_a_job(login_install, tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text(SPEC)
    done = hpctrain(login_install, "submit", "--dry-run", str(spec), cwd=tmp_path, HPCTRAIN_LEDGER=str(tmp_path / "l.db"))
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --job-name=from-wheel" in done.stdout and "ran from a wheel" in done.stdout
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


@pytest.mark.slurm
@pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason="the wheel is built and installed on the host's lane")
def test_a_job_submitted_from_the_wheel_runs(dev_cluster, login_install, tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text(SPEC)
    env = {"HPCTRAIN_LEDGER": str(tmp_path / "l.db"), **dev_cluster}
    done = hpctrain(login_install, "submit", "--wait", str(spec), cwd=tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout.splitlines()[-1]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason="the wheel is built and installed on the host's lane")
def test_the_wheel_with_the_compute_stack_runs_the_main_job(dev_cluster, wheel, tmp_path_factory):
    """On 3.11, where the pinned torch has a local wheel: `hpctrain[train]` alone (no source tree) packs
    the standard library's text and trains the main job, 2 nodes x tp=2 x pp=2 under DeepSpeed, to a checkpoint
    (50 of its 400 steps, to keep the test short)."""
    python = interpreter("3.11")
    if python is None:
        pytest.skip("no Python 3.11 on this machine")
    work = tmp_path_factory.mktemp("main-job")
    venv = work / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", f"{wheel}[train]"], check=True,
                   capture_output=True)
    spec = (REPO / "scripts" / "examples" / "gpt-tiny.toml").read_text()
    dev_root, steps = "${HPCTRAIN_DEV_ROOT:-/var/tmp/hpctrain-dev}", '"--steps", "400"'
    assert spec.count(dev_root) == 2 and spec.count(steps) == 1
    (work / "job.toml").write_text(spec.replace(dev_root, str(work)).replace(steps, '"--steps", "50"'))
    env = {"HPCTRAIN_LEDGER": str(work / "l.db"), **dev_cluster}
    bin_dir = venv / "bin"
    text = hpctrain(bin_dir, "data", "text", str(work / "data" / "stdlib-text"), "--max-size", "1M", cwd=work, **env)
    assert text.returncode == 0, text.stderr
    done = hpctrain(bin_dir, "submit", "--site", "dev", "--wait", "job.toml", cwd=work, timeout=600, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout.splitlines()[-1]
    ckpt = work / "checkpoints" / "gpt-tiny-text"
    assert (ckpt / "step_00000050").is_dir()
    verify = hpctrain(bin_dir, "ckpt", "verify", str(ckpt), cwd=work, **env)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.parametrize("args", [("ckpt", "ls"), ("ckpt", "verify"), ("ckpt", "inspect"), ("data", "verify")])
def test_login_node_commands_never_import_torch(args, tmp_path):
    from hpctrain.checkpoint import Checkpointer

    from data_helpers import make_dataset

    with Checkpointer(tmp_path / "ck", journal=None) as ck:
        ck.save(1, {"w": __import__("numpy").ones(4)})
    target = {"ls": tmp_path / "ck", "verify": tmp_path / "ck", "inspect": tmp_path / "ck" / "step_00000001"}
    path = make_dataset(tmp_path / "data", 8, 4).path if args[0] == "data" else target[args[1]]
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpctrain", *args, str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "webdataset" not in imported
