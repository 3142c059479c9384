"""What a job's reads through the node's shard cache did (hpctrain.data.cache), as `show` and `status` say it: the
counts its rank 0 loader journaled with its metrics (`cache_*`), the newest of the task that reported last."""

from __future__ import annotations

from hpctrain.ledger import Ledger

NAMES = (
    "cache_hits",
    "cache_misses",
    "cache_waited",
    "cache_corrupt",
    "cache_source_bytes",
    "cache_bytes",
    "cache_fetch_wait_s",
    "cache_fallbacks",
)


def cache_counts(ledger: Ledger, job_id: int) -> dict[str, float] | None:
    """The job's cache counts by name (without the `cache_` prefix); None when it read through no cache."""
    found = ledger.metrics.last_values(job_id, NAMES)
    return {name.removeprefix("cache_"): value for name, value in found.items()} or None


def cache_words(c: dict[str, float]) -> str:
    """'node cache (rank 0): 40 reads from the cache, 12 shards fetched from the source (340 MB), 3 waited for ...'"""
    parts = [
        f"{c.get('hits', 0):.0f} reads from the cache",
        f"{c.get('misses', 0):.0f} shards fetched from the source ({c.get('source_bytes', 0) / 1e6:.0f} MB)",
    ]
    if c.get("waited"):
        parts.append(f"{c['waited']:.0f} fetched by another process while this one waited")
    if c.get("corrupt"):
        parts.append(f"{c['corrupt']:.0f} corrupt copies fetched again")
    parts.append(f"{c.get('fetch_wait_s', 0):.1f} s waiting for fetches")
    if c.get("fallbacks"):
        parts.append(f"{c['fallbacks']:.0f} shards read from the source for want of room")
    return "node cache (rank 0): " + ", ".join(parts)


def cold_words(c: dict[str, float] | None) -> str:
    """How warm the cache was, for a data-bound alert: '' without a cache."""
    if c is None:
        return ""
    if c.get("misses"):
        return f"; the node's cache was cold: {c['misses']:.0f} shards fetched from the source so far"
    return "; every shard read from the node's cache"
