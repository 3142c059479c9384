"""The torch.distributed process groups of a dp x tp x pp Layout, created in one place."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from hpctrain.parallel.topology import Coord, Layout


@dataclass(frozen=True)
class ProcessGroups:
    """This rank's place in the layout and its tensor-, data- and pipeline-parallel groups."""

    layout: Layout
    coord: Coord
    tp: dist.ProcessGroup
    dp: dist.ProcessGroup
    pp: dist.ProcessGroup


def new_groups(layout: Layout) -> ProcessGroups:
    """Create every group of the layout and return this rank's.

    A collective call: every rank of the default group must make it, with the same layout.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != layout.world_size:
        raise ValueError(f"layout dp*tp*pp = {layout.world_size} does not match the world size {world}")
    mine: dict[str, dist.ProcessGroup] = {}
    for kind in ("tp", "dp", "pp"):
        # new_group must be entered by all ranks for every group, in the same order
        for ranks in layout.all_groups(kind):
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[kind] = group
    return ProcessGroups(layout=layout, coord=layout.coord(rank), **mine)
