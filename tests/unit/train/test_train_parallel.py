"""The reference GPT under DeepSpeed on CPU/gloo: dp x tp x pp layouts against one process, exact resume, CLI."""

import json
import os
import subprocess
import sys

import pytest

from helpers.paths import REPO
from helpers.train import GLOBAL_STATE, reference_losses, reference_training, run_scenario, tiny_spec, torchrun

STEPS = 5
# Observed: at most one float32 ulp (~1e-7) from the single process. Tighter than needed for "same
# training" on purpose: Adam hides gradient-scale errors (e.g. a wrong clipping norm) to ~1e-5.
FP32_RTOL = 1e-6
BF16_RTOL = 2e-3


def spec_json(spec) -> dict:
    return spec.model_dump(mode="json", by_alias=True)


def max_relative_error(got: list[float], want: list[float]) -> float:
    assert len(got) == len(want)
    return max(abs(g - w) / abs(w) for g, w in zip(got, want))


# Synthetic progressions and standard-library text (`hpctrain data text`'s bytes): the latter's loss falls
# the way a real run's does, so a layout that mixed up samples or slices could not match by chance.
@pytest.mark.slow
@pytest.mark.parametrize(("layout", "extra", "rtol", "data"), [
    ((1, 2, 2), {}, FP32_RTOL, "synthetic"),
    ((1, 2, 2), {}, FP32_RTOL, "text"),
    ((2, 1, 2), {}, FP32_RTOL, "text"),
    ((2, 2, 1), {"zero_stage": 1}, FP32_RTOL, "text"),
    ((1, 2, 2), {"precision": "bf16"}, BF16_RTOL, "synthetic"),
], ids=["dp1-tp2-pp2", "dp1-tp2-pp2-text", "dp2-tp1-pp2-text", "dp2-tp2-pp1-zero1-text", "dp1-tp2-pp2-bf16"])
def test_per_step_losses_match_a_single_process(tmp_path, layout, extra, rtol, data):
    spec = tiny_spec(*layout, **extra)
    got = run_scenario(tmp_path, spec.parallel.world_size, spec=spec_json(spec), mode="losses", steps=STEPS,
                       data=data)["losses"]
    assert max_relative_error(got, reference_losses(spec, STEPS, data)) <= rtol


@pytest.mark.slow
@pytest.mark.parametrize(("layout", "extra", "data"), [((1, 2, 2), {}, "text"),
                                                       ((2, 1, 2), {"zero_stage": 1, "precision": "bf16"}, "synthetic")],
                         ids=["dp1-tp2-pp2-text", "dp2-tp1-pp2-zero1-bf16"])
def test_restoring_local_state_continues_training_bitwise(tmp_path, layout, extra, data):
    spec = tiny_spec(*layout, **extra)
    result = run_scenario(tmp_path, spec.parallel.world_size, spec=spec_json(spec), mode="restore", k=2, n=3, data=data)
    assert result["resumed"] == result["continued"]  # floats from JSON: equal means bitwise equal
    assert result["same_state"], "weights or optimizer state differ after the same steps"
    # hpctrain.train.optimizer: no rank imports torch._dynamo, but where DeepSpeed's ZeRO or bf16 optimizer looks
    # for its Muon optimizer, which compiles a function as it is imported
    assert result["dynamo"] == bool(extra), "torch._dynamo imported (or not) by a rank"


def assert_close_to_scale(got, want, fraction: float):
    import torch

    torch.testing.assert_close(got, want, rtol=0, atol=fraction * want.abs().max().item())


@pytest.mark.slow
def test_local_states_assemble_into_the_single_process_state(tmp_path):
    """Placements tile every global tensor once, replicas agree, and the whole equals one process's state."""
    import torch

    spec = tiny_spec(2, 2, 1, zero_stage=1)
    result = run_scenario(tmp_path, 4, spec=spec_json(spec), mode="restore", k=2, n=1)
    full = torch.load(tmp_path / GLOBAL_STATE)
    _, model, opt = reference_training(spec, 2)
    params = dict(model.named_parameters())
    assert {k.removeprefix("model.") for k in full if k.startswith("model.")} == set(params)
    for name, p in params.items():
        # Scale-relative: Adam turns rounding noise in near-zero gradients into updates of up to lr
        # (observed: 2e-3 of the largest weight, 2e-5 of the largest moment); a misplaced slice is off by O(1).
        assert_close_to_scale(full[f"model.{name}"], p.detach(), 1e-2)
        for key in ("exp_avg", "exp_avg_sq"):
            assert_close_to_scale(full[f"optim.{key}.{name}"], opt.state[p][key], 1e-3)
    assert (float(full["optim.step"]), int(full["engine.global_steps"]), int(full["engine.global_samples"])) == (
        2.0, 2, 2 * spec.parallel.samples_per_step)
    assert result["resumed"] == result["continued"]


def write_spec(path, parallel: str, tasks: int):
    path.write_text(f"""
name = "tiny"
command = ["python", "-m", "hpctrain.train"]
seed = 7
resources = {{ tasks_per_node = {tasks} }}
parallel = {{ {parallel} }}
model = {{ layers = 4, heads = 4, hidden = 64, vocab = 256, seq_len = 32 }}
hyperparameters = {{ lr = 1e-3 }}
""")
    return path


@pytest.mark.slow
def test_entry_point_prints_one_json_line_per_step_from_rank_0(tmp_path, monkeypatch):
    spec_path = write_spec(tmp_path / "spec.toml", "dp = 1, tp = 2, pp = 1, micro_batch = 2, grad_accum = 2", 2)
    monkeypatch.setenv("HPCTRAIN_SPEC", str(spec_path))
    lines = torchrun(2, "-m", "hpctrain.train", "--steps", "3", fork=False).stdout.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(set(r) == {"step", "loss", "step_time_s", "tokens_per_s"} for r in records)
    assert all(r["step_time_s"] > 0 and r["tokens_per_s"] > 0 for r in records)
    want = reference_losses(tiny_spec(1, 2, 1), 3)
    assert max_relative_error([r["loss"] for r in records], want) <= FP32_RTOL


def test_entry_point_reports_an_unsupported_zero_stage_as_one_line(tmp_path):
    spec_path = write_spec(tmp_path / "spec.toml", "zero_stage = 2", 1)
    done = subprocess.run([sys.executable, "-m", "hpctrain.train", "--spec", str(spec_path), "--steps", "1"],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines()[-1] == (
        "hpctrain.train: error: parallel.zero_stage = 2: the reference trainer runs DeepSpeed's pipeline engine, "
        "which supports ZeRO stage 0 or 1 only")
