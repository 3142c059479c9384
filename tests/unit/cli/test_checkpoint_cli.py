"""`hpctrain ckpt ls|verify|inspect|export`, driven through click's test runner on the group."""

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file

from hpctrain.checkpoint import Checkpointer
from hpctrain.cli.ckpt import ckpt
from hpctrain.checkpoint.format import to_torch
from hpctrain.errors import CheckpointError

from helpers.checkpoint import chunk_file, flip_byte, same_bits, special_array

STATE = {"model": {"w": to_torch(special_array("bfloat16", (6, 4))), "b": torch.arange(3)}, "epoch": 1}


@pytest.fixture
def ckdir(tmp_path):
    with Checkpointer(tmp_path / "ck", layout={"tp": 1}, journal=None) as ck:
        for step in (1, 2):
            ck.save(step, STATE, cursor={"sample": step * 10}, metrics={"loss": 1.0 / step})
    return tmp_path / "ck"


def run(*args: str):
    return CliRunner().invoke(ckpt, [str(a) for a in args], catch_exceptions=True)


def test_ls_lists_newest_first_and_flags_a_damaged_one(ckdir):
    (ckdir / "step_00000001" / "manifest.json").unlink()
    res = run("ls", ckdir)
    assert res.exit_code == 0, res.output
    lines = [line for line in res.output.splitlines() if "step_0000" in line]
    assert "step_00000002" in lines[0] and "ok" in lines[0] and '"loss": 0.5' in lines[0]
    assert "step_00000001" in lines[1] and "no manifest.json" in res.output


def test_verify_a_checkpoint_and_a_directory(ckdir):
    res = run("verify", ckdir / "step_00000002")
    assert res.exit_code == 0 and "ok:" in res.output and "2 tensors, 2 chunks" in res.output
    flip_byte(chunk_file(ckdir / "step_00000001", "model/w", (0, 0)))
    res = run("verify", ckdir)
    assert isinstance(res.exception, CheckpointError)
    assert str(res.exception) == f"1 of 2 checkpoints in {ckdir} failed verification"
    assert "checksum mismatch" in res.output
    res = run("verify", ckdir / "step_00000001")
    assert isinstance(res.exception, CheckpointError) and "tensor 'model/w' chunk c/0/0" in str(res.exception)


@pytest.mark.parametrize("kind, what", [("tmp", "an unfinished save"), ("trash", "a checkpoint being deleted")])
def test_verify_refuses_a_directory_that_is_not_committed_even_with_a_manifest(ckdir, kind, what):
    staged = ckdir / f"step_00000002.{kind}-a1.3"
    (ckdir / "step_00000002").rename(staged)  # as a save that wrote its manifest but was not renamed yet
    res = run("verify", staged)
    assert isinstance(res.exception, CheckpointError) and "ok" not in res.output
    assert str(res.exception) == f"{staged}: {what} of step 2, not a checkpoint (resume never reads it)"


def test_inspect_shows_tensors_layout_and_cursor(ckdir):
    res = run("inspect", ckdir / "step_00000002")
    assert res.exit_code == 0, res.output
    assert "step 2, 1 rank(s)" in res.output and 'layout: {"tp": 1}' in res.output
    assert 'cursor {"sample": 20}' in res.output and "bfloat16" in res.output and "model/w" in res.output
    manifest = json.loads(run("inspect", "--json", ckdir / "step_00000002").output)
    assert manifest["step"] == 2 and sorted(manifest["tensors"]) == ["model/b", "model/w"]


@pytest.mark.parametrize("fmt", ["torch", "safetensors"])
def test_export_writes_every_tensor_whole_and_bit_exact(ckdir, tmp_path, fmt):
    out = tmp_path / f"out.{fmt}"
    res = run("export", ckdir / "step_00000002", out, "--format", fmt)
    assert res.exit_code == 0, res.output
    assert "exported 2 tensors and 1 values of step 2" in res.output
    if fmt == "torch":
        tensors = torch.load(out, weights_only=True)
        assert tensors.pop("epoch") == 1  # a plain value of the saved tree
    else:
        tensors = load_file(out)
        with safe_open(out, "pt") as f:
            assert json.loads(f.metadata()["values"]) == {"epoch": 1} and f.metadata()["step"] == "2"
    assert sorted(tensors) == ["model/b", "model/w"]
    assert same_bits(tensors["model/w"], STATE["model"]["w"]) and same_bits(tensors["model/b"], STATE["model"]["b"])


def test_a_missing_manifest_is_one_clear_error(ckdir):
    (ckdir / "step_00000002" / "manifest.json").unlink()
    res = run("inspect", ckdir / "step_00000002")
    assert isinstance(res.exception, CheckpointError) and "no manifest.json" in str(res.exception)


def test_loading_the_cli_module_imports_no_heavy_library():
    code = ("import sys, hpctrain.cli.ckpt; "
            "print(sorted(m for m in ('torch', 'numpy', 'tensorstore', 'zarr', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_ls_adds_the_evaluation_jobs_outcomes_the_ledger_has(ckdir, tmp_path, monkeypatch):
    from hpctrain.ledger import Ledger

    assert "evaluations" not in run("ls", ckdir).output  # no ledger here: the table as it was
    monkeypatch.setenv("HPCTRAIN_LEDGER", str(tmp_path / "ledger.db"))
    with Ledger(tmp_path / "ledger.db") as ledger:
        job = ledger.jobs.record({"name": "a", "site": "dev"})
        ledger.evaluations.request(job, -1, 2, "heldout", str(ckdir / "step_00000002"))
        ledger.evaluations.done(job, -1, 2, "heldout", {"eval/loss": 2.5}, at=1.0)
    res = run("ls", ckdir)
    line = next(ln for ln in res.output.splitlines() if "step_00000002" in ln)
    assert "evaluations" in res.output and "heldout: eval/loss 2.5" in line
