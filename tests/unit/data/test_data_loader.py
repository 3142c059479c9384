"""The loader: DP/TP splitting in real processes, exact resume in fresh processes, state checks, metrics."""

import json
import multiprocessing as mp
import subprocess
import sys
import tarfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from hpctrain.data import ShardLoader
from hpctrain.errors import DataError

from helpers.data import (KW, SAMPLE_BYTES, epoch_keys, fork_workers, make_dataset, resume_and_finish, take,
                          take_across_epochs)

ALL = {f"s{i:05d}" for i in range(100)}


@pytest.fixture
def index(tmp_path):
    return make_dataset(tmp_path, 100, per_shard=9)  # 12 shards: 11 x 9 + 1


@pytest.fixture(scope="module")
def spawn():
    """Fresh interpreters (not forks of this one) whose DataLoader workers are forked, as a rank's are."""
    with ProcessPoolExecutor(2, mp_context=mp.get_context("spawn"), initializer=fork_workers) as pool:  # one a core
        yield pool


def test_dp2_tp2_peers_match_and_dp_ranks_cover_the_dataset_once(index, spawn):
    # global rank g = dp_rank * tp + tp_rank; 12 shards over 2 ranks x 2 workers: shards split unevenly
    runs = list(spawn.map(epoch_keys, [str(index.path)] * 4, [g // 2 for g in range(4)], [2] * 4, range(4), [4] * 4))
    assert runs[0] == runs[1] and runs[2] == runs[3]
    assert len(runs[0]) == len(runs[2]) == 50
    assert Counter(runs[0] + runs[2]) == Counter(ALL)


def test_resume_in_a_fresh_process_continues_sample_for_sample(index, spawn):
    reference = take_across_epochs(ShardLoader(index.path, **KW), 50)  # two epochs
    cases = []
    for k in (1, 2, 7, 24, 25, 31):  # mid-shard, odd (the other worker is next), end of epoch, next epoch
        loader = ShardLoader(index.path, **KW)
        assert take_across_epochs(loader, k) == reference[: 4 * k]
        cases.append((str(index.path), json.dumps(loader.state_dict()), 50 - k, json.dumps(KW)))
    for (_, _, rest, _), got in zip(cases, spawn.map(resume_and_finish, *zip(*cases))):
        assert got == reference[len(reference) - 4 * rest:]


def test_breaking_out_and_iterating_again_continues(index):
    reference = take(ShardLoader(index.path, **KW), None)
    loader = ShardLoader(index.path, **KW)
    got = take(loader, 3) + take(loader, 5) + take(loader, None)
    assert got == reference and loader.epoch == 1


def test_state_is_json_and_names_shard_and_offset_per_worker(index):
    loader = ShardLoader(index.path, **KW)
    take(loader, 3)
    state = json.loads(json.dumps(loader.state_dict()))
    assert (state["epoch"], state["seed"], state["dp_size"], state["next_worker"]) == (0, 11, 1, 1)
    assert [p["shard"].endswith(".tar") and p["offset"] >= 0 for p in state["positions"]] == [True, True]


def test_order_depends_on_seed_and_epoch_only(index):
    a, b = ShardLoader(index.path, **KW), ShardLoader(index.path, **KW)
    epoch0 = take(a, None)
    assert epoch0 == take(b, None) and Counter(epoch0) == Counter(ALL)
    assert take(a, None) != epoch0
    assert take(ShardLoader(index.path, **{**KW, "seed": 12}), None) != epoch0


def test_in_process_reading_matches_worker_processes_when_worker_count_is_one(index):
    one = dict(KW, workers=1)
    assert take(ShardLoader(index.path, **one), None) == take(ShardLoader(index.path, **{**one, "workers": 0}), None)


def test_undecoded_batches_hold_the_stored_bytes_in_and_out_of_worker_processes(index):
    # a worker writes them straight into shared memory
    with tarfile.open(index.shard_path(index.shards[0])) as tar:
        first = {m.name.removesuffix(".npy"): tar.extractfile(m).read() for m in tar}
    for workers in (0, 2):
        got = {}
        for batch in ShardLoader(index.path, **{**KW, "workers": workers, "decode": False}):
            data, offsets = batch["npy"]
            got.update((k, data[offsets[i]:offsets[i + 1]].numpy().tobytes()) for i, k in enumerate(batch["__key__"]))
        assert got.keys() == ALL and {k: got[k] for k in first} == first


def test_reused_buffers_give_the_same_batches_from_a_few_shared_segments(index):
    kw = {**KW, "workers": 2, "decode": False}
    plain = [(batch["__key__"], bytes(batch["npy"][0].numpy()), batch["npy"][1].tolist())
             for batch in ShardLoader(index.path, **kw)]
    loader, storages, got = ShardLoader(index.path, **kw, reuse_buffers=True), [], []
    for _ in range(2):  # two epochs: new workers, new buffers
        for batch in loader:
            data, offsets = batch["npy"]
            storages.append(data.untyped_storage())  # held: a new segment per batch would show as a new address
            got.append((batch["__key__"], bytes(data.numpy()), offsets.tolist()))  # valid until the next batch
    epoch = len(plain)
    assert got[:epoch] == plain and len(got) == 2 * epoch and {k for b in got[epoch:] for k in b[0]} == ALL
    segments = {s.data_ptr() for s in storages}
    assert len(segments) <= 2 * 2 * (loader.prefetch_factor + 1) < len(got)  # epochs x workers x buffers each
    with pytest.raises(ValueError, match="reuse_buffers needs decode=False"):
        ShardLoader(index.path, **KW, reuse_buffers=True)


@pytest.mark.parametrize("change", [{"dp_size": 4, "dp_rank": 1}, {"workers": 1}, {"batch_size": 5}])
def test_another_layout_is_refused_unless_approximate(index, change):
    saved = ShardLoader(index.path, **KW)
    take(saved, 12)  # about half of the epoch
    other = ShardLoader(index.path, **{**KW, **change})
    with pytest.raises(DataError, match="exact resume is impossible.*approximate=True"):
        other.load_state_dict(saved.state_dict())
    other.load_state_dict(saved.state_dict(), approximate=True)
    rest = take(other, None)
    share = 100 // other.dp_size
    assert abs(len(rest) - share * 13 / 25) <= other.batch_size * max(other.workers, 1)


def test_approximate_resume_at_the_very_end_starts_the_next_epoch(index):
    saved = ShardLoader(index.path, **KW)
    take(saved, 24)  # 96 of 100 samples: rounds to the end in whole batches of 50
    other = ShardLoader(index.path, **{**KW, "batch_size": 50})
    other.load_state_dict(saved.state_dict(), approximate=True)
    assert other.epoch == 1 and len(take(other, None)) == 100


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.update(seed=1), "seed 1"),
    (lambda s: s.update(index="0" * 16), "another dataset"),
    (lambda s: s.update(dp_rank=1, dp_size=2), "exact resume is impossible"),
    (lambda s: s["positions"][0].update(shard="nope.tar"), "worker 0 at nope.tar"),
    (lambda s: s.pop("epoch"), "'epoch' is missing"),
    (lambda s: s.update(positions=[1, 2]), "'positions' must be"),
    (lambda s: s.update(version=99), "version 1"),
])
def test_incompatible_or_malformed_state_is_a_data_error(index, edit, message):
    loader = ShardLoader(index.path, **KW)
    take(loader, 3)
    state = loader.state_dict()
    edit(state)
    with pytest.raises(DataError, match=message):
        ShardLoader(index.path, **KW).load_state_dict(state)


def test_stats_count_samples_bytes_and_waiting(index):
    loader = ShardLoader(index.path, **KW)
    take(loader, None)
    metrics = loader.stats.metrics()
    assert (loader.stats.batches, loader.stats.samples, loader.stats.bytes) == (25, 100, 100 * SAMPLE_BYTES)
    assert metrics["data_samples_per_s"] > 0 and metrics["data_bytes_per_s"] == pytest.approx(
        metrics["data_samples_per_s"] * SAMPLE_BYTES)
    assert 0 <= metrics["data_wait_s"] <= metrics["data_wait_total_s"]


@pytest.mark.parametrize("name", ["000001.npy", "dir/000001.seg.npy", "a.b/c.d.e", "noext", "dir/", ".hidden", "x."])
def test_samples_are_keyed_as_webdataset_keys_them(name):
    from webdataset.tariterators import base_plus_ext

    from hpctrain.data.tarshard import key_and_extension

    assert key_and_extension(name) == base_plus_ext(name)


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z"  # a zombie has exited
    except FileNotFoundError:
        return True


def test_workers_die_with_their_training_process(index):
    # Left alive, a killed rank's worker holds the rank's gloo sockets open: its peers would not notice
    # the rank gone until torch's own check (every 5 s) ends the worker.
    script = ("import multiprocessing, sys, time\nfrom hpctrain.data import ShardLoader\n"
              f"loader = ShardLoader({str(index.path)!r}, batch_size=4, workers=2, seed=1)\nbatches = iter(loader)\nnext(batches)\n"
              "print(*[p.pid for p in multiprocessing.active_children()], flush=True)\ntime.sleep(60)\n")
    rank = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in rank.stdout.readline().split()]
    assert len(workers) == 2 and not any(map(gone, workers))
    rank.kill()
    rank.wait()
    deadline = time.monotonic() + 2
    while not all(map(gone, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(map(gone, workers))
