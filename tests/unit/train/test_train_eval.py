"""The reference trainer's held-out evaluation: the same loss as one process on the same samples, under every
dp x tp x pp layout, for the initial weights and after training."""

import shutil

import pytest

from hpctrain.checkpoint.reader import quick_check
from hpctrain.config.job import JobSpec
from hpctrain.config.loading import validate
from hpctrain.errors import ConfigError, DataError
from hpctrain.ledger.journal import Journal
from hpctrain.train.evaluation import data_split
from hpctrain.train.model import gpt_sequential

from helpers.train import (TINY_MODEL, pack_text_dataset, reference_eval_loss, reference_training, run_scenario,
                           tiny_spec, train_ranks, trainer_spec)

STEPS = 2
# Each layout takes 8 samples a step, so that all of them evaluate the same 2 x 8 samples.
LAYOUTS = {"dp1-tp2-pp2": ((1, 2, 2), {"grad_accum": 4}), "dp2-tp1-pp2": ((2, 1, 2), {"grad_accum": 2}),
           "dp2-tp2-pp1-zero1": ((2, 2, 1), {"grad_accum": 2, "zero_stage": 1})}


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_eval_loss_is_one_process_loss_on_the_same_samples_under_every_layout(tmp_path, layout):
    held_out = pack_text_dataset(tmp_path / "held-out", TINY_MODEL["seq_len"], count=40, shard_bytes=2048).path
    dims, extra = LAYOUTS[layout]
    spec = JobSpec.model_validate({**tiny_spec(*dims, **extra).model_dump(mode="json", by_alias=True),
                                   "eval": {"index": str(held_out), "batches": 2}})
    assert spec.parallel.samples_per_step == 8
    got = run_scenario(tmp_path, 4, spec=spec.model_dump(mode="json", by_alias=True), mode="eval", k=STEPS,
                       held_out=str(held_out), data="text")
    initial = reference_eval_loss(gpt_sequential(spec.model, seed=spec.seed), spec, held_out)
    trained = reference_eval_loss(reference_training(spec, STEPS, "text")[1], spec, held_out)
    assert got["before"]["eval/loss"] == pytest.approx(initial, rel=1e-5)
    assert got["after"]["eval/loss"] == pytest.approx(trained, rel=1e-5)
    assert trained < initial  # the weights moved: the second evaluation saw new weights, not a cached loss
    assert got["after"]["eval/bpb"] == pytest.approx(got["after"]["eval/loss"] / 0.6931471805599453)


def test_a_shared_shard_or_a_held_out_share_without_training_data_is_one_line(tmp_path):
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=40, shard_bytes=2048).path
    copy = tmp_path / "copy"
    shutil.copytree(index.parent, copy)
    base = tiny_spec().model_dump(mode="json", by_alias=True)
    spec = JobSpec.model_validate({**base, "data": {"index": str(index)}, "eval": {"index": str(copy / index.name)}})
    with pytest.raises(DataError, match=r"shard shard-000000.tar is also in the training index"):
        data_split(spec)
    with pytest.raises(ConfigError, match=r"spec.toml: eval.holdout: holds out shards of data.index: set data.index"):
        validate(JobSpec, {**base, "eval": {"holdout": 0.2}}, "spec.toml")


@pytest.mark.slow
def test_the_trainer_evaluates_held_out_shards_and_keeps_the_best_checkpoint_by_eval_loss(tmp_path):
    """Every 2 steps, at each checkpoint (every 3) and at the last step: journaled, printed, in the manifests;
    retention keeps the newest and the best by eval/loss."""
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=200, shard_bytes=4096).path
    spec = tmp_path / "spec.toml"
    spec.write_text(trainer_spec("gpt-eval", seed=7, index=index, ckpt=tmp_path / "ck", every_steps=3,
                                 resources={"gpus_per_node": 4})
                    + "keep_last = 1\nkeep_best = 1\nbest_metric = \"eval/loss\"\n"
                    + "\n[eval]\nholdout = 0.25\nevery_steps = 2\nbatches = 1\n")
    stderr: list[str] = []
    steps = train_ranks(spec, 6, tmp_path / "journal", stderr)
    assert [s["step"] for s in steps] == [1, 2, 3, 4, 5, 6]
    evaluated = {r["step"]: r["values"] for _, r in Journal(tmp_path / "journal").records(["metrics"])
                 if "eval/loss" in r["values"]}
    assert sorted(evaluated) == [2, 3, 4, 6]
    assert all(v["eval/bpb"] == pytest.approx(v["eval/loss"] / 0.6931471805599453) for v in evaluated.values())
    printed = [ln for ln in stderr[0].splitlines() if ln.startswith("hpctrain.train: step ") and "eval/loss" in ln]
    assert len(printed) == 4
    kept = sorted(p.name for p in (tmp_path / "ck").glob("step_*"))
    # the newest (6), and step 3 only if its eval loss was the lower one
    best = 3 if evaluated[3]["eval/loss"] < evaluated[6]["eval/loss"] else 6
    assert kept == sorted({f"step_{best:08d}", "step_00000006"})
    manifest = quick_check(tmp_path / "ck" / "step_00000006")
    assert manifest.data["metrics"]["eval/loss"] == evaluated[6]["eval/loss"]
