"""Damaged checkpoints are detected with a message naming checkpoint and array, recorded, and skipped."""

import json
import os

import numpy as np
import pytest

from hpctrain.checkpoint import Checkpointer, Shard, latest_valid, load, load_latest, verify
from hpctrain.errors import CheckpointError
from hpctrain.ledger.journal import Journal

from helpers.checkpoint import chunk_file, flip_byte, ranks_save, same_bits, special_array


def state(step: int) -> dict:
    return {"model": {"w": special_array("float32", (16, 8), step), "b": special_array("bfloat16", (40,), step)},
            "step": step}


@pytest.fixture
def two_checkpoints(tmp_path):
    with Checkpointer(tmp_path, journal=None) as ck:
        return [ck.save(s, state(s)).result() for s in (1, 2)]


def damage(kind: str, ckpt) -> None:
    if kind == "flip":
        flip_byte(chunk_file(ckpt, "model/b"), at=17)
    elif kind == "truncate":
        os.truncate(chunk_file(ckpt, "model/b"), 11)
    elif kind == "delete_chunk":
        chunk_file(ckpt, "model/b").unlink()
    elif kind == "delete_manifest":
        (ckpt / "manifest.json").unlink()
    elif kind == "garble_manifest":
        (ckpt / "manifest.json").write_text('{"format": "hpctrain.checkpoint", "vers')


EXPECTED = {
    "flip": "step_00000002: tensor 'model/b' chunk c/0: checksum mismatch",
    "truncate": "step_00000002: tensor 'model/b' chunk c/0: 11 bytes, expected 80",
    "delete_chunk": "step_00000002: tensor 'model/b' chunk c/0: file missing",
    "delete_manifest": "step_00000002: no manifest.json",
    "garble_manifest": "step_00000002/manifest.json: unreadable",
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_damage_is_named_recorded_and_the_previous_checkpoint_is_used(tmp_path, two_checkpoints, kind, caplog):
    first, second = two_checkpoints
    damage(kind, second)
    journal = Journal(tmp_path / "journal")
    with pytest.raises(CheckpointError, match=EXPECTED[kind]):
        verify(second)
    restored = load_latest(tmp_path, to="numpy", journal=journal)
    assert restored.path == first and restored.step == 1
    assert same_bits(restored.state["model"]["b"], state(1)["model"]["b"])
    (record,) = [r for _, r in journal.records()]
    assert (record["state"], record["step"], record["path"]) == ("corrupt", 2, str(second))
    assert EXPECTED[kind].split(": ", 1)[1] in record["note"] and EXPECTED[kind].split(": ", 1)[1] in caplog.text
    assert latest_valid(tmp_path, full=True) == first


def test_a_flipped_byte_passes_the_quick_check_and_is_caught_on_load(tmp_path, two_checkpoints):
    _, second = two_checkpoints
    flip_byte(chunk_file(second, "model/w", (0, 0)), at=100)
    assert latest_valid(tmp_path) == second  # quick: manifest and file sizes only
    with pytest.raises(CheckpointError, match="tensor 'model/w' chunk c/0/0: checksum mismatch"):
        load(second)
    # Reading only an undamaged tensor of the same checkpoint still works: verification is per array.
    assert same_bits(load(second, {"model": {"b": np.zeros(40, state(2)["model"]["b"].dtype)}})["model"]["b"],
                     state(2)["model"]["b"])


def test_damage_in_one_shard_fails_only_readers_of_that_shard(tmp_path):
    w = special_array("float16", (4, 6))
    path, _ = ranks_save(tmp_path, [{"w": Shard(w[:2], (4, 6), (0, 0))}, {"w": Shard(w[2:], (4, 6), (2, 0))}])
    flip_byte(chunk_file(path, "w", (1, 0)))
    assert same_bits(load(path, {"w": Shard(np.zeros((2, 6), np.float16), (4, 6), (0, 0))})["w"].data, w[:2])
    with pytest.raises(CheckpointError, match="tensor 'w' chunk c/1/0: checksum mismatch"):
        load(path, {"w": Shard(np.zeros((2, 6), np.float16), (4, 6), (2, 0))})


def test_resume_refuses_to_start_afresh_silently_when_every_checkpoint_is_damaged(tmp_path, two_checkpoints):
    first, second = two_checkpoints
    damage("delete_manifest", first)
    damage("flip", second)
    assert latest_valid(tmp_path) == second  # quick check only
    with pytest.raises(CheckpointError, match="none of its 2 checkpoints is usable \\(newest: .*step_00000002: "
                                              "tensor 'model/b' chunk c/0: checksum mismatch"):
        load_latest(tmp_path)
    assert load_latest(tmp_path / "fresh") is None  # a directory without checkpoints: a fresh start


def test_a_manifest_missing_chunk_records_is_malformed(tmp_path, two_checkpoints):
    _, second = two_checkpoints
    manifest = json.loads((second / "manifest.json").read_text())
    manifest["tensors"]["model/b"]["chunk_records"] = []
    (second / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="malformed.*'model/b': its chunk records do not match"):
        load(second)
    assert latest_valid(tmp_path) == two_checkpoints[0]
