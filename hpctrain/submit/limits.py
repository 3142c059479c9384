"""Cluster limits read once from `scontrol show config` and cached per site in the ledger."""

from __future__ import annotations

import json
import time

from hpctrain.config.site import SiteConfig
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient

CACHED_KEYS = ("MaxArraySize", "MaxJobCount", "MaxStepCount", "MinJobAge", "KillWait", "PreemptMode", "PreemptType", "SlurmctldParameters")
MAX_AGE_S = 24 * 3600


def cluster_limits(site: SiteConfig, ledger: Ledger, client: SlurmClient, max_age_s: float = MAX_AGE_S) -> dict[str, str]:
    """The cached limits, refreshed from one `scontrol show config` call when older than ``max_age_s``."""
    row = ledger.get("site_cache", (site.name, "limits"))
    if row and time.time() - row["fetched_at"] < max_age_s:
        return json.loads(row["value_json"])
    config = client.config()
    limits = {k: config[k] for k in CACHED_KEYS if k in config}
    ledger.upsert("site_cache", {"site": site.name, "key": "limits", "value_json": limits, "fetched_at": time.time()},
                  pk=("site", "key"))
    return limits


def max_array_size(site: SiteConfig, ledger: Ledger, client: SlurmClient) -> int:
    """Tasks per array: the site config's value, else the cluster's MaxArraySize (task indices 0..MaxArraySize-1)."""
    if site.slurm.max_array_size is not None:
        return site.slurm.max_array_size
    return int(cluster_limits(site, ledger, client).get("MaxArraySize", "1001"))
