"""The framework integrations' resume points, without a cluster (their runs: test_integrations_cluster.py)."""

from __future__ import annotations

from hpctrain.contract import JOURNAL_ENV
from hpctrain.integrations import hf, lightning
from hpctrain.ledger.journal import Journal


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


def journaled(directory) -> list[tuple[int, dict]]:
    return [(r["step"], r["values"]) for _, r in Journal(directory).records(["metrics"])]


def test_the_trainers_logged_values_go_to_the_journal_from_the_main_process_only(tmp_path, monkeypatch):
    from transformers import TrainerState

    monkeypatch.setenv(JOURNAL_ENV, str(tmp_path))
    callback = hf.HpctrainCallback(guard=object())  # type: ignore[arg-type]
    logs = {"loss": 2.5, "learning_rate": 1e-3, "eval_loss": 2.75, "eval_runtime": 0.5, "flag": True, "note": "x"}
    callback.on_log(None, TrainerState(global_step=50, is_world_process_zero=True), None, logs=logs)
    callback.on_log(None, TrainerState(global_step=50, is_world_process_zero=False), None, logs=logs)
    assert journaled(tmp_path) == [(50, {"loss": 2.5, "learning_rate": 1e-3, "eval/loss": 2.75, "eval/runtime": 0.5})]


def test_lightnings_logged_values_go_to_the_journal_by_their_names(tmp_path, monkeypatch):
    import torch

    monkeypatch.setenv(JOURNAL_ENV, str(tmp_path))
    logger = lightning.HpctrainLogger()
    logger.log_metrics({"train_loss": torch.tensor(0.5), "eval/loss": 0.75, "epoch": 1}, step=49)
    logger.log_metrics({"train_loss": 0.25})  # no step: nothing to file it under
    assert journaled(tmp_path) == [(49, {"train_loss": 0.5, "eval/loss": 0.75})]
    assert logger.name == "hpctrain" and logger.version == "local"
