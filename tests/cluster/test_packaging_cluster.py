"""Jobs submitted from the wheel run on the dev cluster: a login-node install, and `hpctrain[train]` alone (no
source tree) training the main job (the wheel's contents and pip's resolutions:
tests/unit/project/test_packaging.py)."""

from __future__ import annotations

import os

import pytest

from hpctrain.checkpoint.reader import quick_check
from hpctrain.contract import EVAL_LOSS

from helpers.paths import REPO
from helpers.wheels import SPEC, hpctrain, interpreter, venv_with

pytestmark = pytest.mark.slurm


@pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason="the wheel is built and installed on the host's lane")
def test_a_job_submitted_from_the_wheel_runs(dev_cluster, login_install, tmp_path):
    spec = tmp_path / "job.toml"
    spec.write_text(SPEC)
    env = {"HPCTRAIN_LEDGER": str(tmp_path / "l.db"), **dev_cluster}
    dry = hpctrain(login_install, "submit", "--dry-run", str(spec), cwd=tmp_path, **env)
    assert dry.returncode == 0, dry.stderr
    assert "#SBATCH --job-name=from-wheel" in dry.stdout and "ran from a wheel" in dry.stdout
    done = hpctrain(login_install, "submit", "--wait", str(spec), cwd=tmp_path, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a fresh venv's first imports compile torch's modules: minutes under CI load
@pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason="the wheel is built and installed on the host's lane")
def test_the_wheel_with_the_compute_stack_runs_the_main_job(dev_cluster, wheel, tmp_path_factory):
    """On 3.11, where the pinned torch has a local wheel: `hpctrain[train]` alone (no source tree) packs
    the standard library's text and trains the main job, 2 nodes x tp=2 x pp=2 under DeepSpeed, to a checkpoint
    (50 of its 400 steps, to keep the test short), evaluated on held-out text."""
    python = interpreter("3.11")
    if python is None:
        pytest.skip("no Python 3.11 on this machine")
    work = tmp_path_factory.mktemp("main-job")
    bin_dir = venv_with(python, work / "venv", f"{wheel}[train]")  # by uv: pip took 570 s of CI with the lanes beside
    spec = (REPO / "scripts" / "examples" / "gpt-tiny.toml").read_text()
    dev_root, steps = "${HPCTRAIN_DEV_ROOT:-/var/tmp/hpctrain-dev}", '"--steps", "400"'
    assert spec.count(dev_root) == 3 and spec.count(steps) == 1
    (work / "job.toml").write_text(spec.replace(dev_root, str(work)).replace(steps, '"--steps", "50"'))
    env = {"HPCTRAIN_LEDGER": str(work / "l.db"), **dev_cluster}
    text = hpctrain(bin_dir, "data", "text", str(work / "data" / "stdlib-text"), "--max-size", "1M", "--held-out", "1M",
                    cwd=work, timeout=600, **env)
    assert text.returncode == 0, text.stderr
    done = hpctrain(bin_dir, "submit", "--site", "dev", "--wait", "job.toml", cwd=work, timeout=1200, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "COMPLETED" in done.stdout.splitlines()[-1]
    ckpt = work / "checkpoints" / "gpt-tiny-text"
    assert quick_check(ckpt / "step_00000050").data["metrics"][EVAL_LOSS] < 5.55  # held out, better than uniform
    verify = hpctrain(bin_dir, "ckpt", "verify", str(ckpt), cwd=work, **env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
