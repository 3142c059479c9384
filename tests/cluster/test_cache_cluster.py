"""The node's shard cache on the dev cluster (issue 62): jobs read a dataset from a source of fixed pace
(helpers.slow_source, which logs each read with its node) through a site `[cache]` on each node (a folder per node:
the dev cluster's nodes share one host), each rank two epochs of its share, and say what they read: the same batches
as without a cache, bitwise, whatever the cache did."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hpctrain.data import ShardLoader, pack

from helpers.cli import run_cli
from helpers.data import flip_byte, make_dataset
from helpers.paths import REPO
from helpers.slow_source import reads, slow_index

pytestmark = pytest.mark.slurm
# Each rank (4 a job) reads two epochs of its share through the node's cache, and says what it read, where.
READER = """import json, os, sys
from hpctrain.data import ShardLoader
from hpctrain.data.cache import node_cache
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
loader = ShardLoader(sys.argv[1], batch_size=4, dp_rank=rank, dp_size=size, workers=1, seed=3,
                     cache=node_cache("node"))
epochs = [[str(k) for batch in loader for k in batch["__key__"]] for _ in range(2)]
with open(f"{sys.argv[2]}/rank{rank}.json", "w") as out:
    json.dump({"node": os.environ["SLURMD_NODENAME"], "epochs": epochs, "cache": loader.stats.metrics()}, out)
"""


def reader_job(tmp_path, site, index_path, name: str, resources: str):
    """Run READER as job ``name`` through ``site``, each rank's report in tmp_path/name: that folder."""
    out = tmp_path / name
    out.mkdir()
    spec = tmp_path / f"job-{name}.toml"
    spec.write_text(f'name = "cache-{name}"\n'
                    f"command = {json.dumps(['python', str(tmp_path / 'reader.py'), str(index_path), str(out)])}\n"
                    f"resources = {{ {resources}, mem = \"1G\", time = \"10\" }}\n")
    submitted = subprocess.run([sys.executable, "-m", "hpctrain", "submit", "--site", str(site), "--wait", str(spec)],
                               capture_output=True, text=True, timeout=600)
    assert submitted.returncode == 0 and "COMPLETED" in submitted.stdout, submitted.stdout + submitted.stderr
    return out


def cache_site(tmp_path, name: str, extra: str = "") -> Path:
    """The dev site with a cache folder per node under tmp_path/name."""
    site = tmp_path / f"site-{name}.toml"
    site.write_text((REPO / "site_configs" / "dev.toml").read_text()
                    + f'\n[cache]\ndir = "{tmp_path}/{name}/${{SLURMD_NODENAME}}"\n{extra}')
    (tmp_path / "reader.py").write_text(READER)
    return site


def assert_read_as_without_a_cache(out, index, ranks: int) -> None:
    for rank in range(ranks):
        said = json.loads((out / f"rank{rank}.json").read_text())
        plain = ShardLoader(index, batch_size=4, dp_rank=rank, dp_size=ranks, workers=1, seed=3)
        assert said["epochs"] == [[str(k) for batch in plain for k in batch["__key__"]] for _ in range(2)]


def test_two_jobs_on_two_nodes_fetch_each_shard_once_a_node_and_read_it_bitwise(dev_cluster, isolated_ledger,
                                                                                   tmp_path):
    index = make_dataset(tmp_path / "ds", 200, per_shard=9)  # 23 shards
    log = tmp_path / "reads.log"
    slow = slow_index(index, tmp_path / "slow" / "index.json", log, 2e5)
    site = cache_site(tmp_path, "cache")
    outs = [reader_job(tmp_path, site, slow.path, job, "nodes = 2, gpus_per_node = 2") for job in ("first", "second")]
    fetched = Counter(reads(log))
    assert fetched and max(fetched.values()) == 1, [k for k, n in fetched.items() if n > 1]
    assert {name for name, _ in fetched} == {s.name for s in index.shards}  # every shard, read through the cache
    for out in outs:
        assert_read_as_without_a_cache(out, index, 4)
        assert all(json.loads(p.read_text())["cache"]["cache_hits"] > 0 for p in out.glob("rank*.json"))
    node = sorted({n for _, n in fetched})[0]  # `hpctrain cache` there, as a job step: its copies are those it fetched
    listed = run_cli("cache", "ls", "--node", node, "--site", str(site), "--json", timeout=300)
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["host"] == node and found["dir"] == f"{tmp_path}/cache/{node}/hpctrain-{os.getuid()}"
    by_name = {s.sha256: s.name for s in index.shards}
    assert sorted(by_name[c["sha256"]] for c in found["copies"]) == sorted(n for n, at in fetched if at == node)
    assert all(c["verified"] and not c["in_use"] for c in found["copies"])


def test_a_corrupted_copy_is_fetched_again_and_a_capped_cache_evicts_and_reads_bitwise(dev_cluster, isolated_ledger,
                                                                                      tmp_path):
    """Jobs on all three nodes, a rank each: a copy corrupted on one node is fetched again there once and never read;
    a cache capped at 1 MiB on each node, under the 3 MB read, evicts (some shards fetched again) and still reads as
    without a cache."""
    index = pack(({"__key__": f"s{i:04d}", "npy": np.full(8192, i, dtype=np.float64)} for i in range(48)),
                 tmp_path / "ds", shard_bytes=256 << 10)  # 64 kB samples, shards of 256 kB
    log = tmp_path / "reads.log"
    slow = slow_index(index, tmp_path / "slow" / "index.json", log, 2e6)
    site = cache_site(tmp_path, "cache")
    everywhere = "nodes = 3, gpus_per_node = 1"
    reader_job(tmp_path, site, slow.path, "warm", everywhere)
    before = Counter(reads(log))
    assert max(before.values()) == 1
    victim_shard, victim_node = sorted(before)[0]
    [copy] = (tmp_path / "cache" / victim_node).glob(f"hpctrain-*/shards/{index.shards[0].sha256}.tar")
    flip_byte(copy, 5000)
    out = reader_job(tmp_path, site, slow.path, "after", everywhere)
    assert Counter(reads(log)) - before == Counter({(victim_shard, victim_node): 1})
    assert_read_as_without_a_cache(out, index, 3)
    said = [json.loads(p.read_text()) for p in out.glob("rank*.json")]
    assert sum(s["cache"]["cache_corrupt"] for s in said if s["node"] == victim_node) == 1
    capped = cache_site(tmp_path, "capped", 'max_size = "1M"\n')
    before = Counter(reads(log))
    out = reader_job(tmp_path, capped, slow.path, "capped", everywhere)
    assert_read_as_without_a_cache(out, index, 3)
    again = Counter(reads(log)) - before
    assert max(again.values()) > 1  # evicted, then read again
    for node in {n for _, n in again}:
        assert sum(p.stat().st_size for p in (tmp_path / "capped" / node).glob("hpctrain-*/shards/*.tar")) <= 1 << 20
