"""Packing shards, the index, `hpctrain data pack|verify`, and keeping torch out of the CLI's imports."""

import hashlib
import io
import json
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from click.testing import CliRunner

from hpctrain.data import ShardLoader, load_index, pack
from hpctrain.cli.data import data
from hpctrain.errors import DataError

from helpers.cli import run_cli
from helpers.data import flip_byte, make_dataset


def test_index_describes_the_shards_it_lists(tmp_path):
    index = make_dataset(tmp_path, 50, per_shard=8)
    assert [s.samples for s in index.shards] == [8, 8, 8, 8, 8, 8, 2]
    for shard in index.shards:
        content = index.shard_path(shard).read_bytes()
        assert shard.bytes == len(content) and shard.sha256 == hashlib.sha256(content).hexdigest()
    assert load_index(index.path) == index


def test_packing_is_reproducible(tmp_path):
    a, b = make_dataset(tmp_path / "a", 20, per_shard=8), make_dataset(tmp_path / "b", 20, per_shard=8)
    assert a.shards == b.shards


@pytest.mark.parametrize("keys", [["a", "b.c"], ["a", "a"], ["a", ""]])
def test_keys_readers_would_misgroup_are_refused(tmp_path, keys):
    with pytest.raises(DataError, match="sample key"):
        pack(({"__key__": k, "npy": np.zeros(1)} for k in keys), tmp_path)


@pytest.mark.parametrize("content", ["{not json", json.dumps({"format": "other"}),
                                     json.dumps({"format": "hpctrain-shards/1", "shards": [{"name": "x"}]})])
def test_bad_index_is_a_data_error_naming_the_file(tmp_path, content):
    path = tmp_path / "index.json"
    path.write_text(content)
    with pytest.raises(DataError, match="index.json"):
        load_index(path)


def test_pack_command_stores_npy_files_byte_for_byte(tmp_path):
    src = tmp_path / "src"
    arrays = {f"{d}/x{i}": np.random.default_rng(i).standard_normal((3, 4)).astype(np.float32)
              for d in ("a", "b") for i in range(5)}
    for key, array in arrays.items():
        (src / key).parent.mkdir(parents=True, exist_ok=True)
        np.save(src / f"{key}.npy", array)
    result = CliRunner().invoke(data, ["pack", str(src), str(tmp_path / "out"), "--shard-size", "1M"])
    assert result.exit_code == 0, result.output
    assert "packed 10 samples into 1 shards" in result.output
    index = tmp_path / "out" / "index.json"
    raw = ShardLoader(index, batch_size=3, workers=0, decode=False)
    stored = {}
    for batch in raw:
        blob, offsets = batch["npy"]
        stored.update((k, blob[offsets[i]:offsets[i + 1]].numpy().tobytes()) for i, k in enumerate(batch["__key__"]))
    assert stored == {k: (src / f"{k}.npy").read_bytes() for k in arrays}
    decoded = {b["__key__"][0]: b["npy"][0].numpy() for b in ShardLoader(index, batch_size=1, workers=0)}
    assert decoded.keys() == arrays.keys() and all(np.array_equal(decoded[k], arrays[k]) for k in arrays)


def test_pack_command_refuses_an_empty_directory(tmp_path):
    (tmp_path / "src").mkdir()
    result = CliRunner().invoke(data, ["pack", str(tmp_path / "src"), str(tmp_path / "out")])
    assert isinstance(result.exception, DataError) and "no .npy files" in str(result.exception)


def test_verify_reports_each_bad_shard_in_one_line(tmp_path):
    index = make_dataset(tmp_path, 40, per_shard=8)
    ok = CliRunner().invoke(data, ["verify", str(index.path)])
    assert ok.exit_code == 0 and ok.output.strip() == "5 of 5 shards ok"

    truncated, flipped, garbled = (index.shard_path(s) for s in index.shards[1:4])
    truncated.write_bytes(truncated.read_bytes()[:-700])
    flip_byte(flipped, 600)  # inside the first sample's data: size, headers and count still match
    flip_byte(garbled, 4 * 1024)  # the fifth sample's header: tar readers stop there
    bad = CliRunner().invoke(data, ["verify", str(index.path)])
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines() == [
        f"{truncated}: size {index.shards[1].bytes - 700} bytes, index says {index.shards[1].bytes}",
        f"{flipped}: sha256 {hashlib.sha256(flipped.read_bytes()).hexdigest()}, index says {index.shards[2].sha256}",
        f"{garbled}: 4 samples, index says 8",
        "2 of 5 shards ok",
    ]


def test_cli_module_imports_neither_torch_nor_webdataset_nor_numpy():
    code = "import sys, hpctrain.cli.data; print(sorted({'torch', 'webdataset', 'numpy'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_text_packs_source_files_as_byte_sequences_deterministically(tmp_path):
    from hpctrain.data.text import SEPARATOR, pack_text

    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "b.py").write_text("print('b')\n" * 40)
    (src / "pkg" / "a.py").write_text("x = 'é'\n" * 30)
    (src / "pkg" / "__pycache__").mkdir()
    (src / "pkg" / "__pycache__" / "c.py").write_text("never read\n")
    first, none = pack_text(tmp_path / "one", [src], 15, 2**20, 2**10)
    again = pack_text(tmp_path / "two", [src], 15, 2**20, 2**10)[0]
    assert none is None
    assert [s.sha256 for s in first.shards] == [s.sha256 for s in again.shards] and len(first.shards) > 1
    assert CliRunner().invoke(data, ["verify", str(first.path)]).exit_code == 0
    text = (src / "b.py").read_bytes() + SEPARATOR + (src / "pkg" / "a.py").read_bytes() + SEPARATOR
    got = b""
    for shard in first.shards:  # samples in the order they were written
        with tarfile.open(first.shard_path(shard)) as tar:
            got += b"".join(np.load(io.BytesIO(tar.extractfile(m).read())).astype(np.uint8).tobytes()
                            for m in tar.getmembers())
    assert got == text[:len(got)] and len(text) - len(got) < 16


def test_held_out_text_comes_from_files_the_training_text_never_read(tmp_path):
    from hpctrain.data.holdout import first_samples
    from hpctrain.data.text import pack_text

    src = tmp_path / "src"
    src.mkdir()
    for name in "abc":
        (src / f"{name}.py").write_text(f"{name} = 1\n" * 20)  # 120 bytes each
    train, held = pack_text(tmp_path / "out", [src], 9, 150, 2**10, held_out_bytes=50)  # a whole, b in part
    assert held is not None and held.path == tmp_path / "out" / "held-out" / "index.json"
    got = b"".join(s["npy"].astype(np.uint8).tobytes() for s in first_samples(held, held.total_samples))
    assert held.total_samples == 5 and got == (src / "c.py").read_bytes()[:50]
    with pytest.raises(DataError, match=r"no text is left after the first 400 bytes to hold out"):
        pack_text(tmp_path / "all", [src], 9, 400, 2**10, held_out_bytes=50)
    done = run_cli("data", "text", str(tmp_path / "cli"), "--src", str(src), "--seq-len", "9", "--held-out", "1M")
    assert done.returncode == 2 and done.stderr == (
        "hpctrain: error: no text is left after the first 8388608 bytes to hold out: take less (--max-size)\n")


def test_cli_text_packs_a_source_tree_and_refuses_bad_sizes_and_empty_trees(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.py").write_text("value = 1\n" * 100)
    done = CliRunner().invoke(data, ["text", str(tmp_path / "out"), "--src", str(src), "--seq-len", "9"])
    assert done.exit_code == 0, done.output
    assert done.output == f"wrote 100 sequences of 10 bytes in 1 shards: {tmp_path / 'out' / 'index.json'}\n"
    bad = CliRunner().invoke(data, ["text", str(tmp_path / "x"), "--src", str(src), "--max-size", "lots"])
    assert bad.exit_code == 2 and "--max-size" in bad.output
    (tmp_path / "empty").mkdir()
    empty = run_cli("data", "text", str(tmp_path / "y"), "--src", str(tmp_path / "empty"))
    assert empty.returncode == 2 and empty.stderr == f"hpctrain: error: no .py files under {tmp_path / 'empty'}\n"
