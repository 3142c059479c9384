"""Held-out data: a share of an index's shards chosen by name, never trained on; a separate held-out index that
shares no shard; the first samples in index order."""

from dataclasses import replace

import pytest

from hpctrain.data import ShardLoader
from hpctrain.data.holdout import check_disjoint, first_samples, split_holdout
from hpctrain.data.index import load_index
from hpctrain.errors import DataError

from helpers.data import make_dataset


def test_a_share_of_the_shards_is_held_out_by_name_whatever_their_order(tmp_path):
    index = make_dataset(tmp_path, 100, per_shard=10)
    train, held = split_holdout(index, 0.2)
    assert len(held.shards) == 2 and len(train.shards) == 8
    assert {s.name for s in train.shards}.isdisjoint(s.name for s in held.shards)
    assert [s.name for s in train.shards] == [s.name for s in index.shards if s not in held.shards]  # order kept
    shuffled = replace(index, shards=tuple(reversed(index.shards)))
    assert {s.name for s in split_holdout(shuffled, 0.2)[1].shards} == {s.name for s in held.shards}
    assert len(split_holdout(index, 0.01)[1].shards) == 1  # at least one


def test_the_training_loader_never_reads_a_held_out_sample(tmp_path):
    index = make_dataset(tmp_path, 60, per_shard=10)
    train, held = split_holdout(index, 0.3)
    loader = ShardLoader(train, batch_size=4, workers=0, seed=3)
    seen = {key for _ in range(2) for batch in loader for key in batch["__key__"]}
    held_keys = {s["__key__"] for s in first_samples(held, held.total_samples)}
    assert len(held_keys) == 20 and len(seen) == 40 and seen.isdisjoint(held_keys)


def test_holding_out_every_shard_is_one_line(tmp_path):
    index = make_dataset(tmp_path, 5, per_shard=10)
    assert len(index.shards) == 1
    with pytest.raises(DataError, match=r"eval.holdout = 0.5 of 1 shards leaves none to train on"):
        split_holdout(index, 0.5)


def test_a_held_out_index_sharing_a_shard_with_training_is_refused(tmp_path):
    train = make_dataset(tmp_path / "train", 40, per_shard=10)
    other = make_dataset(tmp_path / "other", 40, per_shard=10)  # the same samples: the same shard contents
    with pytest.raises(DataError, match=r"shard .* is also in the training index .*never be trained on"):
        check_disjoint(train, other)
    check_disjoint(*split_holdout(train, 0.25))


def test_first_samples_are_read_in_index_order_and_too_few_is_one_line(tmp_path):
    index = load_index(make_dataset(tmp_path, 25, per_shard=10).path)
    got = first_samples(index, 23)
    assert [s["__key__"] for s in got] == [f"s{i:05d}" for i in range(23)]
    assert got[22]["npy"].tolist() == [22] * 8  # decoded
    with pytest.raises(DataError, match=r"the evaluation needs 26 samples, the held-out shards hold 25"):
        first_samples(index, 26)
