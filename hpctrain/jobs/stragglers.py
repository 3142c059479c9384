"""Stragglers: ranks whose own compute time per step (journaled by hpctrain.runtime.stragglers) is far above
that of the fastest rank of their pipeline stage, which does the same work. Tensor-parallel peers wait for
each other inside the forward pass and share a node: a slow GPU or node shows as its whole group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hpctrain.ledger import Ledger

FACTOR = 1.5  # this many times the stage's fastest rank


@dataclass(frozen=True)
class Straggler:
    rank: int
    node: str
    ratio: float  # its compute time over its stage's fastest

    def __str__(self) -> str:
        return f"rank {self.rank} on {self.node} ({self.ratio:.1f}x its stage's fastest)"


def stragglers(ranks: list[dict[str, Any]], factor: float = FACTOR) -> list[Straggler]:
    """From one `ranks` record's entries ({rank, node, stage, compute_s}), by rank."""
    fastest: dict[int, float] = {}
    for r in ranks:
        fastest[r["stage"]] = min(fastest.get(r["stage"], r["compute_s"]), r["compute_s"])
    return [
        Straggler(r["rank"], r["node"], r["compute_s"] / fastest[r["stage"]])
        for r in sorted(ranks, key=lambda r: r["rank"])
        if fastest[r["stage"]] > 0 and r["compute_s"] >= factor * fastest[r["stage"]]
    ]


def latest(ledger: Ledger, job_id: int) -> tuple[int, list[Straggler]] | None:
    """The step of the job's latest `ranks` record and the stragglers it shows; None if it has none."""
    event = ledger.events.last(job_id, "ranks")
    return (event["data"]["step"], stragglers(event["data"]["ranks"])) if event else None
