"""The reference trainer with shard data (standard-library text) and checkpoints: a 3D run resumed in the same
layout continues exactly (same losses, bitwise-identical final state) as one never stopped; a checkpoint resumes
in another dp x tp x pp layout with the state it saved."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from hpctrain.checkpoint import load_flat

from helpers.train import (GLOBAL_STATE, TINY_MODEL, pack_text_dataset, reference_losses, relative_errors, run_scenario,
                           tiny_spec, train_ranks, trainer_spec)


def test_resume_continues_bitwise(tmp_path):
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=200, shard_bytes=4096).path
    specs = {}
    for name in ("stopped", "straight"):
        specs[name] = tmp_path / f"{name}.toml"
        specs[name].write_text(trainer_spec("gpt-resume", seed=7, index=index, ckpt=tmp_path / f"ck-{name}",
                                            every_steps=2, resources={"gpus_per_node": 4}))
    first = train_ranks(specs["stopped"], 4, tmp_path / "journal")
    resumed = train_ranks(specs["stopped"], 6, tmp_path / "journal")
    straight = train_ranks(specs["straight"], 6, tmp_path / "journal2")
    assert [s["step"] for s in first + resumed] == [1, 2, 3, 4, 5, 6]
    assert [s["loss"] for s in first + resumed] == [s["loss"] for s in straight]
    a, b = load_flat(tmp_path / "ck-stopped" / "step_00000006"), load_flat(tmp_path / "ck-straight" / "step_00000006")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), k
    # Metrics and checkpoint records went to the journal (rank 0 writes metrics once per step).
    kinds = [json.loads(p.read_text())["kind"] for p in sorted((tmp_path / "journal").glob("*.json"))]
    assert kinds.count("metrics") == 6 and kinds.count("checkpoint") >= 3


LAYOUTS = {"dp2-tp2-pp1": "dp = 2\ntp = 2\ngrad_accum = 2", "dp2-tp1-pp2": "dp = 2\npp = 2\ngrad_accum = 2",
           "dp4-tp1-pp1": "dp = 4\ngrad_accum = 1"}  # 8 samples a step in each


@pytest.mark.slow
def test_a_checkpoint_resumes_in_another_layout(tmp_path):
    """Written by dp2 x tp2 x pp1, step 3 resumes as dp1 x tp2 x pp2 and as dp4 x tp1 x pp1 (synthetic data: the
    same samples under any layout): the gathered state is the saved one bit for bit, optimizer moments included,
    and the losses go on as one process's. With shard data, a layout that keeps the dp size (dp2 x tp1 x pp2)
    finds the loader position its ranks need under other ranks and goes on exactly; another dp size says, in
    one line, that the data order goes on only approximately."""
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=200, shard_bytes=4096).path

    def spec(name: str, layout: str, ckpt: Path) -> Path:
        path = tmp_path / f"{name}.toml"
        path.write_text(trainer_spec("gpt-reshard", seed=7, index=index, ckpt=ckpt, every_steps=3,
                                     resources={"gpus_per_node": 4}, parallel=LAYOUTS[layout]))
        return path

    # Synthetic data: the trainer's checkpoint of step 3, resumed in two other layouts.
    saved = tiny_spec(2, 2, 1, grad_accum=2)
    synthetic = tmp_path / "synthetic.json"
    synthetic.write_text(json.dumps({**saved.model_dump(mode="json", by_alias=True, exclude_none=True),
                                     "resources": {"gpus_per_node": 4},
                                     "checkpoint": {"dir": str(tmp_path / "ck-synth"), "every_steps": 3}}))
    train_ranks(synthetic, 3, tmp_path / "journal-synth")
    want = reference_losses(saved, 6)[3:]
    flat = load_flat(tmp_path / "ck-synth" / "step_00000003")
    for dp, tp, pp, accum in ((1, 2, 2, 4), (4, 1, 1, 1)):
        spec_data = tiny_spec(dp, tp, pp, grad_accum=accum).model_dump(mode="json", by_alias=True)
        spec_data["checkpoint"]["dir"] = str(tmp_path / "ck-synth")
        result = run_scenario(tmp_path, 4, spec=spec_data, mode="reshard", n=3)
        assert result["start"] == 3
        assert max(relative_errors(result["losses"], want)) <= 1e-5, (dp, tp, pp)
        state = torch.load(tmp_path / GLOBAL_STATE)
        assert state.keys() == flat.keys() and any(k.startswith("optim.exp_avg_sq.") for k in state)
        assert [k for k in state if not torch.equal(state[k], flat[k])] == [], (dp, tp, pp)

    # Shard data: the straight run in the saved layout, then its step 3 resumed in two others.
    straight = train_ranks(spec("straight", "dp2-tp2-pp1", tmp_path / "ck-straight"), 6, tmp_path / "journal")
    for layout in ("dp2-tp1-pp2", "dp4-tp1-pp1"):
        ckpt = tmp_path / f"ck-{layout}"
        shutil.copytree(tmp_path / "ck-straight" / "step_00000003", ckpt / "step_00000003")
        stderr: list[str] = []
        resumed = train_ranks(spec(layout, layout, ckpt), 6, tmp_path / "journal", stderr)
        assert [s["step"] for s in resumed] == [4, 5, 6]
        approximate = [ln for ln in stderr[0].splitlines() if "the data order goes on at the same fraction" in ln]
        if layout == "dp2-tp1-pp2":
            assert approximate == []
            assert max(relative_errors([s["loss"] for s in resumed], [s["loss"] for s in straight[3:]])) <= 1e-5
        else:
            assert len(approximate) == 1 and "written with dp=2 tp=2 pp=1" in approximate[0] and (
                "this run has dp=4 tp=1 pp=1" in approximate[0])
