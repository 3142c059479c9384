"""hpctrain as users install it: a wheel built from the repository, in a fresh venv away from the source
tree, on every Python the login node may have; and login-node commands that never import torch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

LOGIN_PYTHONS = ("3.10", "3.12", "3.13")
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
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
                   check=True, capture_output=True)
    (built,) = out.glob("hpctrain-*.whl")
    return built


@pytest.fixture(scope="session", params=LOGIN_PYTHONS)
def login_install(request, wheel, tmp_path_factory) -> Path:
    """The wheel with its login-node dependencies only, in a venv of each Python: its bin directory."""
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


def test_a_command_that_needs_the_compute_stack_names_the_extra(login_install, tmp_path):
    done = hpctrain(login_install, "ckpt", "ls", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("hpctrain: error: `hpctrain ckpt` needs ") and done.stderr.count("\n") == 1
    assert "pip install 'hpctrain[ckpt]'" in done.stderr


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
