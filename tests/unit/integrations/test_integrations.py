"""The framework integrations' resume points, without a cluster (their runs: test_integrations_cluster.py)."""

from __future__ import annotations

from hpctrain.integrations import hf, lightning


def test_the_trainer_resumes_from_its_newest_checkpoint_and_starts_fresh_without_one(tmp_path):
    assert hf.last_checkpoint(tmp_path / "absent") is None
    assert hf.last_checkpoint(tmp_path) is None
    for step in (50, 100, 7):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert hf.last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-100")


def test_lightning_resumes_from_the_newest_step_checkpoint(tmp_path):
    assert lightning.last_checkpoint(tmp_path) is None
    for name in ("step-50.ckpt", "step-100.ckpt", "step-24.ckpt", "last.ckpt", "step-999.ckpt.tmp"):
        (tmp_path / name).write_text("")
    assert lightning.last_checkpoint(tmp_path) == str(tmp_path / "step-100.ckpt")
