"""The dp x tp x pp rank layout: Megatron order, TP peers consecutive."""

from hpctrain.parallel import Coord, Layout


def test_tp_innermost_then_dp_then_pp():
    layout = Layout(dp=2, tp=2, pp=2)
    assert [layout.coord(r) for r in (0, 1, 2, 5, 7)] == [
        Coord(0, 0, 0), Coord(0, 1, 0), Coord(1, 0, 0), Coord(0, 1, 1), Coord(1, 1, 1)]
    assert all(layout.rank(layout.coord(r)) == r for r in range(8))


def test_groups_partition_the_world():
    layout = Layout(dp=2, tp=2, pp=2)
    assert layout.all_groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.all_groups("dp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert layout.all_groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for kind in ("tp", "dp", "pp"):
        assert sorted(r for g in layout.all_groups(kind) for r in g) == list(range(8))


def test_tp_peers_share_a_node_when_tp_divides_ranks_per_node():
    layout, per_node = Layout(dp=2, tp=4, pp=2), 8
    for group in layout.all_groups("tp"):
        assert len({r // per_node for r in group}) == 1
