"""`hpctrain model export`: a version of the reference GPT as a folder that plain PyTorch loads without hpctrain,
giving the logits of hpctrain's `sample` path bit for bit; a manifest with the lineage and each file's checksum;
a changed checkpoint or a used folder refused in one line."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
import torch

from hpctrain.config import load_job_spec
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table
from hpctrain.train.sample import load_model

from helpers.cli import run_cli
from helpers.train import TINY_MODEL, pack_text_dataset, train_ranks, trainer_spec
from helpers.venvs import without_hpctrain

# One worker for the module: its trained fixture (about a minute under CI's load) is made once, not on each worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("export-trained")]
PROMPT = [[72, 101, 108, 108, 111, 44, 32, 119], [0, 255, 17, 3, 3, 3, 9, 200]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One process training the reference GPT 4 steps, checkpointed at 2 and 4: (spec, journal)."""
    tmp = tmp_path_factory.mktemp("trained")
    index = pack_text_dataset(tmp / "data", TINY_MODEL["seq_len"], count=64, shard_bytes=4096).path
    toml = tmp / "spec.toml"
    toml.write_text(trainer_spec("gpt-export", seed=7, index=index, ckpt=tmp / "ck", every_steps=2,
                                 resources={"gpus_per_node": 1}, parallel="dp = 1\ngrad_accum = 1"))
    train_ranks(toml, 4, tmp / "journal", nproc=1)
    return load_job_spec(toml), tmp / "journal"


@pytest.fixture
def registered(trained, isolated_ledger):
    spec, journal = trained
    with Ledger(isolated_ledger) as ledger:
        Table(ledger, "jobs").insert({"name": spec.name, "site": "dev", "state": "COMPLETED",
                                      "spec_json": spec.model_dump(mode="json", by_alias=True), "lineage_json": {}})
        ingest_journal(ledger, Journal(journal))
    assert run_cli("model", "register", "gpt", "1").returncode == 0
    return spec


@pytest.mark.parametrize("fmt", ["safetensors", "torch"])
def test_the_export_loads_without_hpctrain_and_gives_the_sample_paths_logits(registered, tmp_path, fmt):
    out = tmp_path / "export"
    done = run_cli("model", "export", "gpt:1", str(out), "--format", fmt)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"] == "gpt" and manifest["version"] == 1 and manifest["checkpoint"]["step"] == 4
    assert set(manifest["files"]) == {f.name for f in out.iterdir()} - {"manifest.json"}
    assert all(hashlib.sha256((out / f).read_bytes()).hexdigest() == h for f, h in manifest["files"].items())
    python = without_hpctrain(tmp_path / "venv")
    script = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import modeling\n"
              "torch.save(modeling.load(sys.argv[1])(torch.tensor(eval(sys.argv[2]))), sys.argv[3])\n")
    logits = tmp_path / "logits.pt"
    plain = subprocess.run([python, "-c", script, str(out), repr(PROMPT), str(logits)], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)
    assert plain.returncode == 0, plain.stderr
    with torch.no_grad():
        want = load_model(registered.model, registered.checkpoint.dir / "step_00000004")(torch.tensor(PROMPT))
    got = torch.load(logits)
    assert got.shape == (2, 8, 256) and torch.equal(got, want)


def test_a_used_folder_and_a_changed_checkpoint_are_refused_in_one_line(registered, tmp_path):
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    refused = run_cli("model", "export", "gpt", str(used))
    assert refused.returncode == 2 and refused.stderr == f"hpctrain: error: {used}: exists and is not an empty folder\n"
    manifest = registered.checkpoint.dir / "step_00000004" / "manifest.json"
    original = manifest.read_bytes()
    try:
        manifest.write_bytes(original.replace(b'"step"', b'"step" ', 1))
        changed = run_cli("model", "export", "gpt", str(tmp_path / "out"))
    finally:
        manifest.write_bytes(original)
    assert changed.returncode == 2 and "changed since it was registered" in changed.stderr
    assert changed.stderr.count("\n") == 1 and not (tmp_path / "out").exists()
    assert (used / "keep.txt").read_text() == "mine" and not list(tmp_path.glob(".out.tmp-*"))
