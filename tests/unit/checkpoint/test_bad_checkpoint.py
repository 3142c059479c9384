"""Checkpoints from a newer format version: refused by name, never deleted (helpers.bad_input)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.bad_input import assert_rejected
from helpers.cli import run_cli

pytestmark = pytest.mark.timeout(180)  # a hang fails with its stack instead of holding the shared machine


@pytest.fixture
def newer_checkpoint(tmp_path) -> tuple[Path, Path]:
    """(directory, its step 10) where step 5 is this format and step 10 a newer one."""
    torch = pytest.importorskip("torch")
    from hpctrain.checkpoint import Checkpointer
    from hpctrain.checkpoint.manifest import VERSION

    directory = tmp_path / "ck"
    ck = Checkpointer(directory, rank=0, world_size=1)
    ck.save(5, {"w": torch.zeros(4)})
    ck.save(10, {"w": torch.ones(4)})
    ck.close()
    manifest = directory / "step_00000010" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["version"] = VERSION + 1
    manifest.write_text(json.dumps(data))
    return directory, directory / "step_00000010"


def tree_bytes(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_ckpt_verify_names_the_newer_format(newer_checkpoint):
    from hpctrain.checkpoint.manifest import VERSION

    directory, newer = newer_checkpoint
    before = tree_bytes(directory)
    out = run_cli("ckpt", "verify", str(newer))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == (f"hpctrain: error: {newer / 'manifest.json'}: format version {VERSION + 1}, "
                                           f"this hpctrain reads {VERSION}")
    out = run_cli("ckpt", "verify", str(directory))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == f"hpctrain: error: 1 of 2 checkpoints in {directory} failed verification"
    assert f"format version {VERSION + 1}" in " ".join(out.stdout.split())
    assert tree_bytes(directory) == before


def test_ckpt_verify_says_it_once(newer_checkpoint):
    _, newer = newer_checkpoint
    out = run_cli("ckpt", "verify", str(newer))
    assert_rejected(out.returncode, out.stderr)


def test_resume_stops_at_a_newer_format(newer_checkpoint):
    from hpctrain.checkpoint import latest_valid
    from hpctrain.errors import CheckpointError

    directory, _ = newer_checkpoint
    with pytest.raises(CheckpointError, match="format version"):
        latest_valid(directory)


def test_saving_the_same_step_keeps_a_newer_format(newer_checkpoint):
    import torch

    from hpctrain.checkpoint import Checkpointer

    directory, newer = newer_checkpoint
    before = tree_bytes(newer)
    ck = Checkpointer(directory, rank=0, world_size=1)
    try:
        ck.save(10, {"w": torch.full((4,), 7.0)})
        ck.close()
    except Exception:  # refusing to save is fine; replacing it is not
        pass
    assert tree_bytes(newer) == before
