"""The reference trainer with shard data (standard-library text) and checkpoints: a 3D run resumed in the same
layout continues exactly (same losses, bitwise-identical final state) as one never stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from hpctrain.checkpoint import load_flat

from train_helpers import TINY_MODEL, pack_text_dataset, trainer_spec

TORCHRUN = Path(sys.executable).with_name("torchrun")



def run(spec: Path, steps: int, journal: Path) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HPCTRAIN_JOURNAL_DIR": str(journal), "HPCTRAIN_JOB_ID": "1"}
    out = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "4", "-m", "hpctrain.train",
                          "--spec", str(spec), "--steps", str(steps)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(ln) for ln in out.stdout.splitlines() if ln.startswith("{")]


def test_resume_continues_bitwise(tmp_path):
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=200, shard_bytes=4096).path
    specs = {}
    for name in ("stopped", "straight"):
        specs[name] = tmp_path / f"{name}.toml"
        specs[name].write_text(trainer_spec("gpt-resume", seed=7, index=index, ckpt=tmp_path / f"ck-{name}",
                                            every_steps=2, resources={"gpus_per_node": 4}))
    first = run(specs["stopped"], 4, tmp_path / "journal")
    resumed = run(specs["stopped"], 6, tmp_path / "journal")
    straight = run(specs["straight"], 6, tmp_path / "journal2")
    assert [s["step"] for s in first + resumed] == [1, 2, 3, 4, 5, 6]
    assert [s["loss"] for s in first + resumed] == [s["loss"] for s in straight]
    a, b = load_flat(tmp_path / "ck-stopped" / "step_00000006"), load_flat(tmp_path / "ck-straight" / "step_00000006")
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert torch.equal(a[k].reshape(-1).view(torch.uint8), b[k].reshape(-1).view(torch.uint8)), k
    # Metrics and checkpoint records went to the journal (rank 0 writes metrics once per step).
    kinds = [json.loads(p.read_text())["kind"] for p in sorted((tmp_path / "journal").glob("*.json"))]
    assert kinds.count("metrics") == 6 and kinds.count("checkpoint") >= 3
