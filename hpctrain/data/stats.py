"""Loader throughput counters, in a form the trainer can journal as metrics."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from hpctrain.data.cache import CacheCounts


@dataclass
class LoaderStats:
    """Counts since the loader was built; rates over the time since its first batch was asked for."""

    last_wait_s: float = 0.0
    wait_s: float = 0.0
    batches: int = 0
    samples: int = 0
    bytes: int = 0
    skipped_samples: int = 0
    quarantined_shards: int = 0
    cache: CacheCounts | None = None  # reads through the node's cache (hpctrain.data.cache), when there is one
    _started: float | None = field(default=None, repr=False)

    def waiting(self) -> float:
        """Call when the training loop asks for a batch; returns the clock to pass to `served`."""
        now = time.perf_counter()
        if self._started is None:
            self._started = now
        return now

    def served(self, since: float) -> None:
        self.last_wait_s = time.perf_counter() - since
        self.wait_s += self.last_wait_s
        self.batches += 1

    def metrics(self) -> dict[str, float]:
        """Flat name -> number, e.g. for ``Journal.write("metrics", step=..., values=loader.stats.metrics())``."""
        elapsed = time.perf_counter() - self._started if self._started is not None else 0.0
        return {
            "data_wait_s": self.last_wait_s,
            "data_wait_total_s": self.wait_s,
            "data_samples_per_s": self.samples / elapsed if elapsed else 0.0,
            "data_bytes_per_s": self.bytes / elapsed if elapsed else 0.0,
            "data_skipped_samples": float(self.skipped_samples),
            "data_quarantined_shards": float(self.quarantined_shards),
            **({f"cache_{k}": float(v) for k, v in asdict(self.cache).items()} if self.cache is not None else {}),
        }
