"""Bad shards: quarantined (file + journal), skipped with a count, the job stopped past the threshold."""

import itertools
import json
import multiprocessing as mp

import pytest

from hpctrain.data import ShardLoader, pack
from hpctrain.data.quarantine import Quarantine
from hpctrain.errors import DataError
from hpctrain.ledger.journal import Journal

from helpers.data import SAMPLE_BYTES, batch_keys, flip_byte, make_dataset, sample

KW = dict(batch_size=4, workers=2, seed=3, shuffle_buffer=4)
BAD = (2, 5, 7)
GOOD = {f"s{i:05d}" for i in range(80) if i // 8 not in BAD}
PARTLY_GOOD = {f"s{i:05d}" for i in [*range(40, 45), *range(46, 48), *range(56, 59)]}  # before the damage
ALLOWED = dict(KW, max_quarantined_fraction=0.3)


@pytest.fixture
def damaged(tmp_path):
    """10 shards of 8: shard 2 truncated, shard 5's sixth sample not a .npy file (the index matches it),
    shard 7's fourth tar header garbled (same size; readers see the shard end after 3 samples)."""
    garbage = b"\x93NUMPY" + b"?" * (SAMPLE_BYTES - 6)  # as long as a good sample: shards stay 8 samples each
    samples = ({**sample(i), "npy": garbage} if i == 45 else sample(i) for i in range(80))
    index = pack(samples, tmp_path / "ds", shard_bytes=8 * SAMPLE_BYTES - 1)
    truncated = index.shard_path(index.shards[2])
    truncated.write_bytes(truncated.read_bytes()[:1500])
    flip_byte(index.shard_path(index.shards[7]), 3 * 1024)  # a sample is a 512-byte header + 512 of data
    return index


def read_epoch(loader):
    keys = []
    for batch in loader:
        keys += batch_keys(batch)
    return keys


def test_bad_shards_are_quarantined_recorded_and_skipped(damaged, tmp_path):
    journal = Journal(tmp_path / "journal")
    loader = ShardLoader(damaged, journal=journal, **ALLOWED)
    keys = read_epoch(loader)

    assert GOOD <= set(keys) and len(keys) == len(set(keys))
    assert all(k in PARTLY_GOOD for k in set(keys) - GOOD)
    assert loader.stats.skipped_samples == 80 - len(keys) and loader.stats.quarantined_shards == 3

    names = [damaged.shards[i].name for i in BAD]
    records = {p.name: json.loads(p.read_text())["reason"] for p in damaged.quarantine_dir.iterdir()}
    assert records.keys() == {f"{n}.json" for n in names}
    assert records[f"{names[0]}.json"].startswith("size 1500 bytes")
    assert "'s00045' does not decode" in records[f"{names[1]}.json"]
    assert records[f"{names[2]}.json"] == "3 samples, index says 8"
    events = [r for _, r in journal.records() if r["kind"] == "shard_quarantined"]
    assert sorted(r["shard"] for r in events) == names
    assert sum(r["skipped_samples"] for r in events) == loader.stats.skipped_samples


def test_a_second_epoch_skips_the_bad_shards_again_and_records_nothing_new(damaged, tmp_path):
    journal = Journal(tmp_path / "journal")
    loader = ShardLoader(damaged, journal=journal, **ALLOWED)
    read_epoch(loader)
    second = set(read_epoch(loader))
    assert GOOD <= second and all(k in PARTLY_GOOD for k in second - GOOD)
    assert len([r for _, r in journal.records() if r["kind"] == "shard_quarantined"]) == 3


@pytest.mark.parametrize("k", [2, 5, 9])
def test_resume_is_exact_across_quarantined_shards(damaged, k):
    reference = read_epoch(ShardLoader(damaged, **ALLOWED))
    loader = ShardLoader(damaged, **ALLOWED)
    head = [key for batch in itertools.islice(loader, k) for key in batch_keys(batch)]
    fresh = ShardLoader(damaged, **ALLOWED)
    fresh.load_state_dict(loader.state_dict())
    assert head + read_epoch(fresh) == reference


def test_passing_the_threshold_stops_with_a_data_error(damaged, tmp_path):
    journal = Journal(tmp_path / "journal")
    loader = ShardLoader(damaged, journal=journal, **{**ALLOWED, "max_quarantined_fraction": 0.15})
    with pytest.raises(DataError, match=r"quarantined shards hold 20.0% .* max_quarantined_fraction 15.0%"):
        read_epoch(loader)
    assert "data_needs_review" in [r["kind"] for _, r in journal.records()]
    with pytest.raises(DataError, match="quarantined shards hold"):  # the next job stops before reading
        ShardLoader(damaged, **{**ALLOWED, "max_quarantined_fraction": 0.15})


def _add(args):
    index_path, shard, reason = args
    from hpctrain.data import load_index

    index = load_index(index_path)
    Quarantine(index, None, 1.0).add(index.shards[shard], reason, 1)


def test_ranks_quarantining_at_once_leave_one_whole_record_per_shard(tmp_path):
    index = make_dataset(tmp_path, 40, per_shard=8)
    jobs = [(str(index.path), i % 3, f"reason {i}") for i in range(24)]
    with mp.get_context("fork").Pool(4) as pool:
        pool.map(_add, jobs)
    files = sorted(p.name for p in index.quarantine_dir.iterdir())
    assert files == [f"{s.name}.json" for s in index.shards[:3]]
    assert all(json.loads((index.quarantine_dir / f).read_text())["reason"].startswith("reason") for f in files)
