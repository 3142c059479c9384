"""Bit-exact round trips in one process: dtypes and special values, nested state, layouts, zarr-python."""

import hashlib
import json
import random
import re
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import zarr

from hpctrain.checkpoint import (Checkpointer, Shard, capture_rng_state, load, load_flat, restore_rng_state,
                                 verify)
from hpctrain.checkpoint import reader, writer
from hpctrain.checkpoint.format import to_torch
from hpctrain.errors import CheckpointError

from helpers.checkpoint import chunk_file, flip_byte, same_bits, special_array
from helpers.paths import REPO
from helpers.venvs import without_hpctrain

DTYPES = ["float32", "bfloat16", "float16", "int64", "bool"]


def save_one(directory: Path, state: dict, step: int = 1, **kw) -> Path:
    with Checkpointer(directory, journal=None) as ck:
        path = ck.save(step, state, **kw).result()
    assert path is not None
    return path


@pytest.mark.parametrize("async_", [False, True])
def test_every_dtype_round_trips_bit_exact_with_special_values(tmp_path, async_):
    state = {"t": {d: to_torch(special_array(d, (33, 7), seed=i)) for i, d in enumerate(DTYPES)},
             "np": {d: special_array(d, (5,), seed=10 + i) for i, d in enumerate(DTYPES)},
             "scalar": torch.tensor(-0.0), "empty": torch.empty(0, 3, dtype=torch.bfloat16),
             "strided": to_torch(special_array("float32", (6, 4))).t()}
    path = save_one(tmp_path, state, async_=async_)
    back = load(path)
    for d in DTYPES:
        assert same_bits(back["t"][d], state["t"][d]), d
        assert same_bits(back["np"][d], to_torch(state["np"][d])), d
    assert same_bits(back["scalar"], state["scalar"]) and back["scalar"].shape == ()
    assert back["empty"].shape == (0, 3) and back["empty"].dtype == torch.bfloat16
    assert same_bits(back["strided"], state["strided"].contiguous())
    as_numpy = load(path, to="numpy")["t"]["bfloat16"]
    assert as_numpy.dtype.name == "bfloat16" and same_bits(as_numpy, state["t"]["bfloat16"])


def test_nested_optimizer_state_and_values_come_back_with_their_types(tmp_path):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 3, "name": "run", "none": None}
    back = load(save_one(tmp_path, state))
    assert back["epoch"] == 3 and back["name"] == "run" and back["none"] is None
    assert list(back["optim"]["state"]) == [0, 1] and back["optim"]["param_groups"][0]["betas"] == (0.9, 0.95)
    model2 = torch.nn.Linear(4, 3)
    opt2 = torch.optim.AdamW(model2.parameters())
    model2.load_state_dict(back["model"])
    opt2.load_state_dict(back["optim"])
    assert all(same_bits(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    assert same_bits(opt2.state_dict()["state"][0]["exp_avg_sq"], opt.state_dict()["state"][0]["exp_avg_sq"])


def test_plain_zarr_python_opens_the_step_as_a_group_of_every_array_with_its_real_dtype(tmp_path):
    state = {"model": {d: to_torch(special_array(d, (9, 4), seed=i)) for i, d in enumerate(DTYPES)},
             "step": 1, "opt": {"lr": 0.5, "betas": [0.9, 0.99]}}
    path = save_one(tmp_path, state)
    group = zarr.open_group(path, mode="r")
    assert group.attrs["hpctrain"] == {"format": "hpctrain.checkpoint", "version": 1, "step": 1,
                                       "values": {"step": 1, "opt/lr": 0.5, "opt/betas/0": 0.9, "opt/betas/1": 0.99}}
    arrays = {name: arr for name, arr in zarr.open_group(path / "tensors", mode="r").members(max_depth=None)
              if isinstance(arr, zarr.Array)}
    assert sorted(arrays) == sorted(f"model/{d}" for d in DTYPES)
    for name, arr in arrays.items():
        dtype = name.removeprefix("model/")
        assert arr.attrs["hpctrain"]["dtype"] == dtype
        want = state["model"][dtype]
        assert arr[...].tobytes() == np.ascontiguousarray(want.view(torch.int16) if dtype == "bfloat16" else want).tobytes()
    assert arrays["model/bfloat16"].dtype == np.uint16


def test_the_docs_recipe_reads_a_checkpoint_in_a_venv_without_hpctrain(tmp_path):
    """The recipe of docs/checkpoints.md (zarr, tensorstore, ml_dtypes only) gets every tensor with its real dtype,
    bit for bit as hpctrain loads it, and the step's plain values."""
    recipe = re.search(r"<!-- recipe: checkpoint in other tools -->\n```python\n(.*?)```",
                       (REPO / "docs" / "checkpoints.md").read_text(), re.S)[1]
    state = {"model": {d: to_torch(special_array(d, (5, 3), seed=i)) for i, d in enumerate(DTYPES)}, "step": 3}
    path = save_one(tmp_path / "ck", state, step=3)
    python = without_hpctrain(tmp_path / "venv")
    script = tmp_path / "recipe.py"
    script.write_text(recipe + "import hashlib, json\nprint(json.dumps({n: [str(a.dtype), list(a.shape), "
                               "hashlib.sha256(a.tobytes()).hexdigest()] for n, a in tensors.items()}))\n")
    done = subprocess.run([python, str(script), str(path)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    values, hashes = done.stdout.splitlines()
    assert values == "step 3 values {'step': 3}"
    want = {n: [str(a.dtype), list(a.shape), hashlib.sha256(a.tobytes()).hexdigest()]
            for n, a in load_flat(path, to="numpy").items()}
    assert json.loads(hashes) == want and want["model/bfloat16"][0] == "bfloat16"


def test_manifest_records_layout_cursor_rng_lineage_and_a_checksum_per_chunk(tmp_path):
    with Checkpointer(tmp_path, layout={"tp": 1}, lineage={"config": "abc"}, journal=None) as ck:
        path = ck.save(7, {"w": torch.ones(3)}, cursor={"shard": 4, "offset": 120}, metrics={"loss": 0.5}).result()
    manifest = json.loads((path / "manifest.json").read_text())
    assert (manifest["step"], manifest["layout"], manifest["lineage"], manifest["metrics"]) == (
        7, {"tp": 1}, {"config": "abc"}, {"loss": 0.5})
    assert manifest["ranks"]["0"]["cursor"] == {"shard": 4, "offset": 120}
    assert set(manifest["ranks"]["0"]["rng"]) >= {"python", "numpy", "torch"}
    (record,) = manifest["tensors"]["w"]["chunk_records"]
    assert record["rank"] == 0 and isinstance(record["crc32c"], int) and manifest["ranks"]["0"]["wrote"] == ["w"]


def test_load_into_callers_layout_fills_in_place_and_may_reshard(tmp_path):
    full = to_torch(special_array("float32", (8, 6)))
    path = save_one(tmp_path, {"w": full, "lr": 0.25})
    # Rows 3..6 cross the saved chunking (one chunk here) and columns are sliced too.
    target = Shard(torch.zeros(3, 4), (8, 6), (3, 1))
    like = {"w": target, "lr": 0.0}
    back = load(path, like)
    assert back["w"] is target and back["lr"] == 0.25
    assert same_bits(target.data, full[3:6, 1:5])
    whole = torch.zeros(8, 6)
    assert load(path, {"w": whole})["w"] is whole and same_bits(whole, full)
    with pytest.raises(CheckpointError, match="'w' is float32 \\[8, 6\\], the target is float16"):
        load(path, {"w": torch.zeros(8, 6, dtype=torch.float16)})


def test_big_full_tensors_are_stored_as_row_blocks_each_verified(tmp_path, monkeypatch):
    monkeypatch.setattr("hpctrain.checkpoint.writer._MAX_CHUNK", 1000)
    big = special_array("int64", (50, 7))  # 2800 bytes: blocks of 17 rows (952 bytes)
    path = save_one(tmp_path, {"big": big})
    assert zarr.open_array(path / "tensors" / "big", mode="r").chunks == (17, 7)
    assert same_bits(load(path, to="numpy")["big"], big)
    middle = Shard(np.zeros((10, 7), np.int64), (50, 7), (30, 0))
    assert same_bits(load(path, {"big": middle})["big"].data, big[30:40])
    flip_byte(chunk_file(path, "big", (0, 0)))
    assert same_bits(load(path, {"big": middle})["big"].data, big[30:40])  # reads blocks 1 and 2 only
    with pytest.raises(CheckpointError, match="tensor 'big' chunk c/0/0: checksum mismatch"):
        load(path)


def test_chunks_read_straight_from_their_files_match_tensorstore_reads(tmp_path, monkeypatch):
    monkeypatch.setattr("hpctrain.checkpoint.writer._MAX_CHUNK", 1000)  # row blocks, the last one padded
    state = {d: special_array(d, (50, 7), seed=i) for i, d in enumerate(DTYPES)}
    state["scalar"] = np.array(-0.0, np.float32)
    path = save_one(tmp_path, state)
    read_chunk, files_read = reader._read_chunk, []
    monkeypatch.setattr(reader, "_read_chunk", lambda *a: files_read.append(a[2]) or read_chunk(*a))
    direct = load(path, to="numpy")
    in_place = load(path, {"bfloat16": torch.empty(50, 7, dtype=torch.bfloat16),
                           "int64": Shard(np.zeros((10, 7), np.int64), (50, 7), (30, 0))})
    assert len(files_read) == 9 + 1 + 2  # every chunk, then bf16's one and int64's blocks 1 and 2
    monkeypatch.setattr(reader, "contiguous_chunks", lambda meta, box: False)
    via_tensorstore = load(path, to="numpy")
    for name, expected in state.items():
        assert same_bits(direct[name], expected) and same_bits(via_tensorstore[name], expected), name
    assert same_bits(in_place["bfloat16"], to_torch(state["bfloat16"]))
    assert same_bits(in_place["int64"].data, state["int64"][30:40])


def test_chunk_files_written_directly_are_those_tensorstore_writes_and_zarr_python_reads_them(tmp_path, monkeypatch):
    monkeypatch.setattr("hpctrain.checkpoint.writer._MAX_CHUNK", 1000)  # row blocks, the last one padded
    monkeypatch.setattr("hpctrain.checkpoint.writer._WRITE_BLOCK", 96)  # each chunk file in several writes
    state = {d: special_array(d, (50, 7), seed=i) for i, d in enumerate(DTYPES)}
    state |= {"vector": special_array("float16", (777,)), "scalar": np.array(-0.0, np.float32),
              "empty": np.empty((0, 3), ml_dtypes.bfloat16)}
    write_chunk, direct_writes = writer._write_chunk, []
    monkeypatch.setattr(writer, "_write_chunk", lambda *a: direct_writes.append(a[0]) or write_chunk(*a))
    direct = save_one(tmp_path / "direct", state)
    assert len(direct_writes) == 9 + 2  # every chunk (float32 and int64 padded), and the vector's two
    monkeypatch.setattr(writer, "contiguous_chunks", lambda meta, box: False)
    via_tensorstore = save_one(tmp_path / "tensorstore", state)
    assert len(direct_writes) == 11

    def files(path: Path) -> dict[str, bytes]:
        return {f.relative_to(path).as_posix(): f.read_bytes() for f in (path / "tensors").rglob("*") if f.is_file()}

    assert files(direct) == files(via_tensorstore)
    for name, expected in state.items():
        arr = zarr.open_array(direct / "tensors" / name, mode="r")
        stored = expected.view(np.uint16) if name in ("bfloat16", "empty") else expected
        assert arr.shape == expected.shape and same_bits(np.asarray(arr[...]), stored), name


def test_load_flat_reads_full_tensors_by_name(tmp_path):
    a, b = to_torch(special_array("bfloat16", (4, 4))), torch.arange(5)
    path = save_one(tmp_path, {"m": {"a": a}, "b": b})
    assert list(load_flat(path, ["m/a"])) == ["m/a"]
    flat = load_flat(path)
    assert same_bits(flat["m/a"], a) and same_bits(flat["b"], b)
    with pytest.raises(CheckpointError, match="no tensor 'nope'"):
        load_flat(path, ["nope"])


@pytest.mark.parametrize("shard, message", [
    (Shard(torch.zeros(3), (10,), (2,)), "not one cell of a regular grid"),
    (Shard(torch.zeros(1), (10,), (9,), chunks=(4,)), "not one cell of a regular grid"),
    (Shard(torch.zeros(2, 2), (10,), (0,)), "differ in rank"),
])
def test_misaligned_shards_are_refused_before_anything_is_written(tmp_path, shard, message):
    with Checkpointer(tmp_path, journal=None) as ck, pytest.raises(CheckpointError, match=message):
        ck.save(1, {"x": shard})
    assert not list(tmp_path.iterdir())


def test_unsupported_values_and_keys_are_refused_with_their_path(tmp_path):
    with Checkpointer(tmp_path, journal=None) as ck:
        with pytest.raises(CheckpointError, match="'a/b' has type object"):
            ck.save(1, {"a": {"b": object()}})
        with pytest.raises(CheckpointError, match="state key '../x'"):
            ck.save(1, {"../x": torch.zeros(1)})
        with pytest.raises(CheckpointError, match="unsupported tensor dtype 'complex64'"):
            ck.save(1, {"c": torch.zeros(2, dtype=torch.complex64)})


def test_verify_reads_every_chunk(tmp_path):
    path = save_one(tmp_path, {"w": to_torch(special_array("float16", (100,)))})
    assert verify(path).step == 1


def test_rng_states_restore_the_same_draws_and_are_json():
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    state = json.loads(json.dumps(capture_rng_state()))
    first = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng_state(state)
    second = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1]) and first[2] == second[2]
