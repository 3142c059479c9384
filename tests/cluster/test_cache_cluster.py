"""The node's shard cache on the dev cluster (issue 62): two jobs of 2 nodes x 2 ranks read a dataset from a source
of fixed pace through a site `[cache]` on each node (a folder per node: the dev cluster's nodes share one host).
Over both jobs and both epochs of each, no node reads a shard from the source twice, and every rank's batches are a
read without the cache's, bitwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from hpctrain.data import ShardLoader

from helpers.cli import run_cli
from helpers.data import make_dataset
from helpers.paths import REPO
from helpers.slow_source import reads, slow_index
from helpers.waiting import wait_until

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


def test_two_jobs_on_two_nodes_fetch_each_shard_once_a_node_and_read_it_bitwise(dev_cluster, isolated_ledger,
                                                                                   tmp_path):
    index = make_dataset(tmp_path / "ds", 200, per_shard=9)  # 23 shards
    log = tmp_path / "reads.log"
    slow = slow_index(index, tmp_path / "slow" / "index.json", log, 2e5)
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site_configs" / "dev.toml").read_text()
                    + f'\n[cache]\ndir = "{tmp_path}/cache/${{SLURMD_NODENAME}}"\n')
    (tmp_path / "reader.py").write_text(READER)
    outs = []
    for job in ("first", "second"):
        out = tmp_path / job
        out.mkdir()
        spec = tmp_path / f"{job}.toml"
        spec.write_text(f'name = "cache-{job}"\n'
                        f"command = {json.dumps(['python', str(tmp_path / 'reader.py'), str(slow.path), str(out)])}\n"
                        'resources = { nodes = 2, gpus_per_node = 2, mem = "1G", time = "10" }\n')
        submitted = subprocess.run([sys.executable, "-m", "hpctrain", "submit", "--site", str(site), "--wait",
                                    str(spec)], capture_output=True, text=True, timeout=600)
        assert submitted.returncode == 0 and "COMPLETED" in submitted.stdout, submitted.stdout + submitted.stderr
        outs.append(wait_until(lambda out=out: len(list(out.glob("rank*.json"))) == 4 and out, 30, 0.5, "4 ranks"))
    fetched = Counter(reads(log))
    assert fetched and max(fetched.values()) == 1, [k for k, n in fetched.items() if n > 1]
    assert {name for name, _ in fetched} == {s.name for s in index.shards}  # every shard, read through the cache
    for out in outs:
        for rank in range(4):
            said = json.loads((out / f"rank{rank}.json").read_text())
            plain = ShardLoader(index, batch_size=4, dp_rank=rank, dp_size=4, workers=1, seed=3)
            assert said["epochs"] == [[str(k) for batch in plain for k in batch["__key__"]] for _ in range(2)]
            assert said["cache"]["cache_hits"] + said["cache"]["cache_misses"] > 0
    node = sorted({n for _, n in fetched})[0]  # `hpctrain cache` there, as a job step: its copies are those it fetched
    listed = run_cli("cache", "ls", "--node", node, "--site", str(site), "--json", timeout=300)
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout)
    assert found["host"] == node and found["dir"] == f"{tmp_path}/cache/{node}/hpctrain-{os.getuid()}"
    by_name = {s.sha256: s.name for s in index.shards}
    assert sorted(by_name[c["sha256"]] for c in found["copies"]) == sorted(n for n, at in fetched if at == node)
    assert all(c["verified"] and not c["in_use"] for c in found["copies"])
