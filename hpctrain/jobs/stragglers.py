"""Stragglers: ranks whose own compute time per step (journaled by hpctrain.runtime.stragglers) is far above
the median of their pipeline stage, whose ranks do the same work (the low median: a stage of two compares with
its faster rank). Against the median, one rank that happened to be fast, or slowed for a moment, flags no other.
Tensor-parallel peers wait for each other inside the forward pass and share a node: a slow GPU or node shows as
its whole group."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpctrain.ledger import Ledger

FACTOR = 1.5  # this many times the stage's median


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    ratio: float  # its compute time over its stage's median

    def __str__(self) -> str:
        return f"rank {self.rank} on {self.node} ({self.ratio:.1f}x its stage's median)"


def stragglers(ranks: list[dict[str, Any]], factor: float = FACTOR) -> list[Straggler]:
    """From one `ranks` record's entries ({rank, node, stage, compute_s}), by rank."""
    times: dict[int, list[float]] = {}
    for r in ranks:
        times.setdefault(r["stage"], []).append(r["compute_s"])
    median = {stage: statistics.median_low(t) for stage, t in times.items()}
    return [
        Straggler(r["rank"], r["node"], r["compute_s"] / median[r["stage"]])
        for r in sorted(ranks, key=lambda r: r["rank"])
        if median[r["stage"]] > 0 and r["compute_s"] >= factor * median[r["stage"]]
    ]


def latest(ledger: Ledger, job_id: int) -> tuple[int, list[Straggler]] | None:
    """The step of the job's latest `ranks` record and the stragglers it shows; None if it has none."""
    return latest_of(ledger, [job_id]).get(job_id)


def latest_of(ledger: Ledger, job_ids: Iterable[int]) -> dict[int, tuple[int, list[Straggler]]]:
    """`latest` of each job that has a `ranks` record."""
    return {
        job_id: (event["data"]["step"], stragglers(event["data"]["ranks"]))
        for job_id, event in ledger.events.last_of(job_ids, "ranks").items()
    }
