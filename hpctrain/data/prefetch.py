"""Fetching into the node's cache (hpctrain.data.cache) the shards a loader worker reads next, in its own order, in
a thread beside it: at most ``ahead_bytes`` past the shard the worker reads (always the next one), so that the next
shard is there, or on its way, when the worker gets to it. A prefetch that fails says nothing: the worker's own read
of that shard fails, or falls back to the source, as it would have. The thread's counts are its own (`taken`): its
fetches count as misses and source bytes, never as the worker's reads or waits."""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence

from hpctrain.data.cache import CacheCounts, ShardCache
from hpctrain.data.index import ShardIndex, ShardInfo


class Prefetcher:
    """Fetches ``order[i]`` for i past the one read (`reading`), within ``ahead_bytes``; `stop` ends it (a fetch under
    way finishes, or dies with the worker)."""

    def __init__(self, cache: ShardCache, index: ShardIndex, order: Sequence[ShardInfo], ahead_bytes: int):
        self.cache = copy.copy(cache)
        self.cache.counts = CacheCounts()
        self.index, self.order, self.ahead = index, list(order), ahead_bytes
        self._reading, self._next, self._stopped = 0, 1, False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="hpctrain-prefetch", daemon=True)
        self._thread.start()

    def reading(self, position: int) -> None:
        """The worker now reads ``order[position]``."""
        with self._changed:
            self._reading = position
            self._next = max(self._next, position + 1)
            self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def taken(self) -> CacheCounts:
        """What the thread's fetches did since the last call."""
        counts, self.cache.counts = self.cache.counts, CacheCounts()
        return counts

    def _due(self) -> bool:
        if self._stopped:
            return True
        if self._next >= len(self.order):
            return False
        ahead = sum(s.bytes for s in self.order[self._reading + 1 : self._next + 1])
        return self._next == self._reading + 1 or ahead <= self.ahead

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(self._due)
                if self._stopped:
                    return
                info = self.order[self._next]
                self._next += 1
            self.cache.prefetch(self.index, info)
