"""Recording bad shards, and stopping the job when too much of the dataset is bad.

Records live next to the index in ``<index>.quarantine/<shard>.json``, one file per shard written
atomically: many ranks (and later jobs) may quarantine the same shard at once without locking,
which shared filesystems do not all provide. A quarantined shard is still tried in later epochs:
whether a shard is skipped must not depend on when a rank read these records, or tensor-parallel
peers would see different data.
"""

from __future__ import annotations

import time

from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.errors import DataError
from hpctrain.files import write_json_atomic
from hpctrain.ledger.journal import Journal


class Quarantine:
    def __init__(self, index: ShardIndex, journal: Journal | None, max_fraction: float):
        self.index = index
        self.journal = journal
        self.max_fraction = max_fraction
        self._recorded_here: set[str] = set()

    def names(self) -> set[str]:
        """Shards quarantined so far by anyone, including this process."""
        folder = self.index.quarantine_dir
        found = {p.name.removesuffix(".json") for p in folder.glob("*.json")} if folder.is_dir() else set()
        return found | self._recorded_here

    def fraction(self) -> float:
        bad = self.names()
        return sum(s.samples for s in self.index.shards if s.name in bad) / max(self.index.total_samples, 1)

    def add(self, shard: ShardInfo, reason: str, skipped: int) -> None:
        """Record ``shard`` as bad (once per process), then check the threshold."""
        if shard.name not in self._recorded_here:
            folder = self.index.quarantine_dir
            folder.mkdir(exist_ok=True)
            write_json_atomic(
                folder / f"{shard.name}.json",
                {"shard": shard.name, "reason": reason, "skipped_samples": skipped, "time": time.time()},
            )
            if self.journal is not None:
                self.journal.write(
                    "shard_quarantined",
                    message=f"{self.index.location(shard)}: {reason}",
                    shard=shard.name,
                    reason=reason,
                    skipped_samples=skipped,
                    index=str(self.index.path),
                )
            self._recorded_here.add(shard.name)
        self.check()

    def check(self) -> None:
        """DataError (and a ``data_needs_review`` journal record) when the quarantined share is over the limit."""
        fraction = self.fraction()
        if fraction <= self.max_fraction:
            return
        message = (
            f"{self.index.path}: quarantined shards hold {fraction:.1%} of the samples, more than "
            f"max_quarantined_fraction {self.max_fraction:.1%}; review {self.index.quarantine_dir}"
        )
        if self.journal is not None:
            self.journal.write("data_needs_review", message=message, index=str(self.index.path), fraction=fraction)
        raise DataError(message)
