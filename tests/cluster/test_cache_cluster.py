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

import numpy as np
import pytest

from hpctrain.data import ShardLoader, pack

from helpers.cli import run_cli
from helpers.cluster import site_with_cache
from helpers.data import flip_byte, make_dataset
from helpers.lanes import lanes
from helpers.slow_source import reads, slow_index
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, lanes(why="the cache is files on each node; Slurm only runs the readers' jobs, "
                                       "which each release's other tests run alike")]
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


def reader_job(tmp_path, site, index_path, name: str, resources: str, wait: bool = True):
    """Run READER as job ``name`` through ``site``, each rank's report in tmp_path/name: that folder (waited for),
    else the ledger and Slurm ids of the job submitted."""
    out = tmp_path / name
    out.mkdir()
    spec = tmp_path / f"job-{name}.toml"
    spec.write_text(f'name = "cache-{name}"\n'
                    f"command = {json.dumps(['python', str(tmp_path / 'reader.py'), str(index_path), str(out)])}\n"
                    f"resources = {{ {resources}, mem = \"1G\", time = \"10\" }}\n")
    how = ["--wait"] if wait else ["--json"]
    submitted = subprocess.run([sys.executable, "-m", "hpctrain", "submit", "--site", str(site), *how, str(spec)],
                               capture_output=True, text=True, timeout=600)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    if not wait:
        ids = json.loads(submitted.stdout)
        return ids["ledger_ids"][0], ids["slurm_ids"][0]
    assert "COMPLETED" in submitted.stdout, submitted.stdout + submitted.stderr
    return out


def cache_site(tmp_path, name: str, extra: str = "", root=None) -> str:
    """The dev site with a cache folder per node under ``root`` (default tmp_path/name)."""
    (tmp_path / "reader.py").write_text(READER)
    root = root or tmp_path / name
    return site_with_cache(tmp_path / f"site-{name}.toml", f"{root}/${{SLURMD_NODENAME}}", extra)


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


def test_a_killed_fetch_a_corrupted_copy_and_a_capped_cache_all_read_bitwise(dev_cluster, isolated_ledger, tmp_path):
    """A job cancelled while its rank fetches a shard from a crawling source leaves nothing the next job trusts: it
    fetches that shard again and reads as without a cache. Then jobs on all three nodes, a rank each: a copy corrupted
    on one node is fetched again there once and never read; a cache capped at 1 MiB on each node, under the 3 MB read,
    evicts (some shards fetched again) and still reads as without a cache."""
    index = pack(({"__key__": f"s{i:04d}", "npy": np.full(8192, i, dtype=np.float64)} for i in range(48)),
                 tmp_path / "ds", shard_bytes=256 << 10)  # 64 kB samples, shards of 256 kB
    log = tmp_path / "reads.log"
    slow = slow_index(index, tmp_path / "slow" / "index.json", log, 2e6)
    site, everywhere = cache_site(tmp_path, "cache"), "nodes = 3, gpus_per_node = 1"  # and the reader's script
    crawl = slow_index(index, tmp_path / "crawl" / "index.json", log, 2e3)  # two minutes a shard
    one = site_with_cache(tmp_path / "site-killed.toml", f"{tmp_path}/killed")  # one folder, whichever node
    killed, slurm_id = reader_job(tmp_path, one, crawl.path, "killed", "nodes = 1, gpus_per_node = 2", wait=False)
    partial = f"hpctrain-{os.getuid()}/shards/.*.tmp"
    wait_until(lambda: list((tmp_path / "killed").glob(partial)), 300, 0.5, "a fetch midway")
    assert run_cli("cancel", str(killed)).returncode == 0
    wait_until(lambda: not subprocess.run(["squeue", "-h", "-j", slurm_id], capture_output=True, text=True).stdout,
               120, 0.5, "the cancelled job's end")
    again = reader_job(tmp_path, one, slow.path, "again", "nodes = 1, gpus_per_node = 2")
    assert_read_as_without_a_cache(again, index, 2)
    fetched = Counter(name for name, _ in reads(log, besides=slurm_id))
    assert fetched == {s.name: 1 for s in index.shards}  # the killed job's shards among them, each once
    assert not list((tmp_path / "killed").glob(partial))  # the killed fetches' files cleared
    settled = Counter(reads(log, besides=slurm_id))
    reader_job(tmp_path, site, slow.path, "warm", everywhere)
    before = Counter(reads(log, besides=slurm_id))
    assert max((before - settled).values()) == 1
    victim_shard, victim_node = sorted(before - settled)[0]
    [copy] = (tmp_path / "cache" / victim_node).glob(f"hpctrain-*/shards/{index.shards[0].sha256}.tar")
    flip_byte(copy, 5000)
    out = reader_job(tmp_path, site, slow.path, "after", everywhere)
    assert Counter(reads(log, besides=slurm_id)) - before == Counter({(victim_shard, victim_node): 1})
    assert_read_as_without_a_cache(out, index, 3)
    said = [json.loads(p.read_text()) for p in out.glob("rank*.json")]
    assert sum(s["cache"]["cache_corrupt"] for s in said if s["node"] == victim_node) == 1
    capped = cache_site(tmp_path, "capped", 'max_size = "1M"\n')
    before = Counter(reads(log, besides=slurm_id))
    out = reader_job(tmp_path, capped, slow.path, "capped", everywhere)
    assert_read_as_without_a_cache(out, index, 3)
    again = Counter(reads(log, besides=slurm_id)) - before
    assert max(again.values()) > 1  # evicted, then read again
    for node in {n for _, n in again}:
        assert sum(p.stat().st_size for p in (tmp_path / "capped" / node).glob("hpctrain-*/shards/*.tar")) <= 1 << 20


@pytest.fixture
def full_tmpfs(tmp_path):
    """A tmpfs of 1 MiB that another program has filled but for 64 kB (mounting needs root: CI and the lanes run as
    root; the lanes' mounts are in their own namespace, which their slurmds share)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "tmpfs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], check=True)
    try:
        (where / "someone-elses").write_bytes(bytes((1 << 20) - (64 << 10)))
        yield where
    finally:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


def test_a_cache_on_a_full_tmpfs_falls_back_with_one_alert_and_reads_bitwise(dev_cluster, isolated_ledger, tmp_path,
                                                                            full_tmpfs):
    """The cache on a tmpfs with 64 kB left, shards of about 256 kB: every shard is read from its source, the job
    reads as without a cache, and says so once a node (two ranks on one node: one alert)."""
    index = pack(({"__key__": f"s{i:04d}", "npy": np.full(8192, i, dtype=np.float64)} for i in range(12)),
                 tmp_path / "ds", shard_bytes=256 << 10)
    site = cache_site(tmp_path, "full", root=full_tmpfs)
    out = reader_job(tmp_path, site, index.path, "full", "nodes = 1, gpus_per_node = 2")
    assert_read_as_without_a_cache(out, index, 2)
    said = [json.loads(p.read_text()) for p in out.glob("rank*.json")]
    assert all(s["cache"]["cache_fallbacks"] > 0 and s["cache"]["cache_hits"] == 0 for s in said)
    assert run_cli("reconcile").returncode == 0
    [job] = [j["id"] for j in json.loads(run_cli("status", "--all", "--json").stdout) if j["name"] == "cache-full"]
    shown = json.loads(run_cli("show", str(job), "--json").stdout)
    [alert] = [e["message"] for e in shown["events"] if e["kind"] == "cache_fallback"]
    assert f"{full_tmpfs}/" in alert and "no room" in alert, alert
