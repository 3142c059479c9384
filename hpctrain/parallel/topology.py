"""Megatron-style rank layout for data x tensor x pipeline parallelism.

Tensor-parallel peers are innermost (consecutive ranks, so on one node), then data-parallel,
then pipeline stages outermost: rank = tp + TP * (dp + DP * pp). This is the order of
DeepSpeed's PipeModelDataParallelTopology(num_pp, num_mp, num_dp) and Megatron's default.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Coord:
    dp: int
    tp: int
    pp: int


@dataclass(frozen=True)
class Layout:
    dp: int
    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def coord(self, rank: int) -> Coord:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} outside world of {self.world_size}")
        tp, rest = rank % self.tp, rank // self.tp
        return Coord(dp=rest % self.dp, tp=tp, pp=rest // self.dp)

    def rank(self, c: Coord) -> int:
        return c.tp + self.tp * (c.dp + self.dp * c.pp)

    def tp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(Coord(c.dp, t, c.pp)) for t in range(self.tp)]

    def dp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(Coord(d, c.tp, c.pp)) for d in range(self.dp)]

    def pp_group(self, rank: int) -> list[int]:
        c = self.coord(rank)
        return [self.rank(Coord(c.dp, c.tp, p)) for p in range(self.pp)]

    def all_groups(self, kind: str) -> list[list[int]]:
        """Every group of one kind ('tp', 'dp' or 'pp'), each listed once, in rank order."""
        get = {"tp": self.tp_group, "dp": self.dp_group, "pp": self.pp_group}[kind]
        seen: dict[tuple[int, ...], None] = {}
        for r in range(self.world_size):
            seen.setdefault(tuple(get(r)), None)
        return [list(g) for g in seen]
