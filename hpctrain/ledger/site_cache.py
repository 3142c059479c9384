"""The site_cache table: Slurm data that changes rarely (cluster limits, a user's associations), cached per site
under a key, with the time it was fetched (`hpctrain.submit.limits` decides when it is stale)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from hpctrain.ledger.rows import SiteCacheRow
from hpctrain.ledger.table import Table

if TYPE_CHECKING:
    from hpctrain.ledger.db import Ledger


class SiteCache:
    """Rows of `site_cache`, keyed by (site, key)."""

    def __init__(self, ledger: Ledger):
        self._rows: Table[SiteCacheRow] = Table(ledger, "site_cache", ("site", "key"))

    def get(self, site: str, key: str) -> SiteCacheRow | None:
        return self._rows.get((site, key))

    def put(self, site: str, key: str, value: Any) -> None:
        """Cache ``value`` (anything JSON holds), fetched now."""
        self._rows.upsert({"site": site, "key": key, "value_json": value, "fetched_at": time.time()})
