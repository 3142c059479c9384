"""Slurm data that changes rarely, cached per site in the ledger: the cluster's limits (`scontrol show
config`) and the user's associations (`sacctmgr show assoc`, a slurmdbd round trip per submission otherwise)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from hpctrain.config.site import SiteConfig
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient

CACHED_KEYS = (
    "MaxArraySize",
    "MaxJobCount",
    "MaxStepCount",
    "MinJobAge",
    "KillWait",
    "PreemptMode",
    "PreemptType",
    "SlurmctldParameters",
)
MAX_AGE_S = 24 * 3600
ASSOC_FIELDS = "account,partition,qos"
ASSOC_MAX_AGE_S = 3600


def cached(site: SiteConfig, ledger: Ledger | None, key: str, max_age_s: float, fetch: Callable[[], Any]) -> Any:
    """The value cached under ``key``, else (missing, older than ``max_age_s``) ``fetch()``'s, stored; without a
    ledger, ``fetch()``'s."""
    if ledger is None:
        return fetch()
    row = ledger.site_cache.get(site.name, key)
    if row and time.time() - row["fetched_at"] < max_age_s:
        return json.loads(row["value_json"] or "null")
    value = fetch()
    ledger.site_cache.put(site.name, key, value)
    return value


def cluster_limits(
    site: SiteConfig, ledger: Ledger, client: SlurmClient, max_age_s: float = MAX_AGE_S
) -> dict[str, str]:
    """The cached limits, refreshed from one `scontrol show config` call when older than ``max_age_s``."""

    def fetch() -> dict[str, str]:
        config = client.config()
        return {k: config[k] for k in CACHED_KEYS if k in config}

    return cached(site, ledger, "limits", max_age_s, fetch)


def user_associations(
    site: SiteConfig, ledger: Ledger | None, client: SlurmClient, user: str, fresh: bool = False
) -> list[dict[str, str]]:
    """``user``'s associations (account, partition, QOS list), from one `sacctmgr` call, cached for an hour
    unless ``fresh`` (or there is no ledger). Callers ask again with ``fresh`` before refusing anything on
    cached rows, so a new association is never refused for an hour; one that was removed is refused by sbatch."""

    def fetch() -> list[dict[str, str]]:
        return client.sacctmgr("assoc", f"user={user}", fields=ASSOC_FIELDS)

    return cached(site, ledger, f"assoc:{user}", 0 if fresh else ASSOC_MAX_AGE_S, fetch)


def max_array_size(site: SiteConfig, ledger: Ledger, client: SlurmClient) -> int:
    """Tasks per array: the site config's value, else the cluster's MaxArraySize (task indices 0..MaxArraySize-1)."""
    if site.slurm.max_array_size is not None:
        return site.slurm.max_array_size
    return int(cluster_limits(site, ledger, client).get("MaxArraySize", "1001"))
