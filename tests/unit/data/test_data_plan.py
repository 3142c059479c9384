"""How an epoch is split across DP ranks and workers, and ordered: pure functions, no files."""

from collections import Counter

import pytest

from hpctrain.data.plan import consumed, plan_epoch, position_after, segment_order, worker_lengths

UNEVEN = [7, 7, 7, 7, 7, 3]  # 6 shards, the last one short: 38 samples


def covered(counts, **kw):
    """Counter of (shard, sample) over every rank and worker, and each rank's sample count."""
    seen, per_rank = Counter(), []
    for rank in range(kw["dp_size"]):
        plan = plan_epoch(counts, dp_rank=rank, **kw)
        per_rank.append(sum(s.length for segs in plan for s in segs))
        seen.update((s.shard, i) for segs in plan for s in segs for i in range(s.start, s.end))
    return seen, per_rank


@pytest.mark.parametrize("dp_size,workers", [(1, 1), (2, 2), (2, 4), (3, 2), (4, 3), (8, 2)])
def test_every_sample_at_most_once_and_ranks_get_equal_shares(dp_size, workers):
    # 6 shards never divide evenly into dp*workers readers here except (1, 1), (3, 2)
    seen, per_rank = covered(UNEVEN, seed=1, epoch=0, dp_size=dp_size, workers=workers, batch_size=2)
    assert set(seen.values()) == {1}
    assert per_rank == [38 // dp_size] * dp_size
    assert len(seen) == 38 - 38 % dp_size


def test_the_left_over_samples_change_with_the_epoch():
    everything = {(s, i) for s, n in enumerate(UNEVEN) for i in range(n)}
    left_out = [everything - set(covered(UNEVEN, seed=1, epoch=e, dp_size=4, workers=1, batch_size=1)[0])
                for e in range(4)]
    assert all(len(x) == 2 for x in left_out)
    assert len({frozenset(x) for x in left_out}) > 1


@pytest.mark.parametrize("samples,workers,batch", [(38, 2, 4), (40, 4, 4), (7, 3, 2), (5, 4, 8), (16, 3, 5)])
def test_round_robin_over_workers_leaves_only_the_last_batch_short(samples, workers, batch):
    lengths = worker_lengths(samples, workers, batch)
    assert sum(lengths) == samples
    batches = [[min(batch, n - k) for k in range(0, n, batch)] for n in lengths]
    served = [b[r] for r in range(max(map(len, batches))) for b in batches if r < len(b)]
    assert all(size == batch for size in served[:-1])


def test_plan_is_a_pure_function_of_its_inputs():
    kw = dict(seed=3, epoch=2, dp_rank=1, dp_size=2, workers=2, batch_size=2)
    assert plan_epoch(UNEVEN, **kw) == plan_epoch(UNEVEN, **kw)
    assert plan_epoch(UNEVEN, **kw) != plan_epoch(UNEVEN, **{**kw, "epoch": 3})
    assert plan_epoch(UNEVEN, **kw) != plan_epoch(UNEVEN, **{**kw, "seed": 4})


def test_segment_order_is_a_seeded_permutation_of_the_segment():
    (segment, *_), *_ = plan_epoch([50], seed=0, epoch=0, dp_rank=1, dp_size=2, workers=1, batch_size=1)
    order = segment_order(segment, seed=0, epoch=0, shuffle_buffer=10)
    assert sorted(order) == list(range(25, 50)) and order != sorted(order)
    assert order == segment_order(segment, seed=0, epoch=0, shuffle_buffer=10)
    assert order != segment_order(segment, seed=0, epoch=1, shuffle_buffer=10)
    assert segment_order(segment, seed=0, epoch=0, shuffle_buffer=0) == list(range(25, 50))


def test_positions_and_consumed_counts_are_inverse():
    (segments,) = plan_epoch(UNEVEN, seed=5, epoch=0, dp_rank=0, dp_size=1, workers=1, batch_size=1)
    for n in range(39):
        position = position_after(segments, n)
        assert consumed(segments, position) == n
    assert position_after(segments, 38) == (len(segments), 0)
