"""The node's shard cache (issue 62): each shard fetched once however many processes want it, verified, kept for the
next epoch, reader and job; a copy corrupted on disk found and fetched again, never read; a cache capped below the
working set evicts what no one reads and trains as without it; a fetch killed midway leaves nothing trusted; a
cache that cannot be written falls back to the source with one alert."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import time
from collections import Counter

import pytest

from hpctrain.data import ShardLoader
from hpctrain.data.cache import ShardCache
from hpctrain.data.prefetch import Prefetcher
from hpctrain.data.tarshard import Shard
from hpctrain.ledger.journal import Journal

from helpers.cli import run_cli
from helpers.data import KW, flip_byte, make_dataset, take_across_epochs
from helpers.paths import REPO
from helpers.slow_source import reads, slow_index
from helpers.waiting import wait_until

RATE = 2e6  # bytes a second from the source: each shard of about 6 kB takes 3 ms, a fetch is seen to wait


@pytest.fixture
def index(tmp_path):
    return make_dataset(tmp_path / "ds", 100, per_shard=9)  # 12 shards


@pytest.fixture
def slow(index, tmp_path):
    return slow_index(index, tmp_path / "slow" / "index.json", tmp_path / "reads.log", RATE)


def read_all(cache: ShardCache, index) -> list[bytes]:
    out = []
    for info in index.shards:
        with cache.location(index, info) as where, open(where, "rb") as fh:
            out.append(fh.read())
    return out


def read_in_process(root: str, index_path: str) -> list[bytes]:
    from hpctrain.data.index import load_index

    return read_all(ShardCache(root), load_index(index_path))


def test_processes_reading_at_once_fetch_each_shard_once_and_read_the_sources_bytes(slow, index, tmp_path):
    with multiprocessing.get_context("fork").Pool(4) as pool:
        got = pool.starmap(read_in_process, [(str(tmp_path / "cache"), str(slow.path))] * 4)
    truth = [index.shard_path(s).read_bytes() for s in index.shards]
    assert all(g == truth for g in got)
    assert Counter(name for name, _ in reads(tmp_path / "reads.log")) == {s.name: 1 for s in index.shards}
    again = ShardCache(tmp_path / "cache")
    assert read_all(again, slow) == truth and len(reads(tmp_path / "reads.log")) == len(index.shards)
    assert again.counts.hits == 12 and again.counts.misses == 0 and again.counts.source_bytes == 0


def test_a_copy_corrupted_on_disk_is_found_fetched_again_and_never_read(slow, index, tmp_path):
    cache = ShardCache(tmp_path / "cache")
    read_all(cache, slow)
    flip_byte(cache.path(slow.shards[3].sha256), 700)
    again = ShardCache(tmp_path / "cache")
    assert read_all(again, slow)[3] == index.shard_path(index.shards[3]).read_bytes()
    assert again.counts.corrupt == 1 and again.counts.misses == 1 and again.counts.hits == 11
    assert Counter(n for n, _ in reads(tmp_path / "reads.log"))[index.shards[3].name] == 2


def test_a_capped_cache_evicts_the_least_recently_used_never_one_in_use(slow, tmp_path):
    size = slow.shards[0].bytes
    cache = ShardCache(tmp_path / "cache", max_bytes=3 * size + 10)
    first, second = slow.shards[:2]
    with cache.location(slow, first) as held:
        for info in slow.shards[1:5]:  # four more through a cache of three: the first is held open throughout
            with cache.location(slow, info):
                pass
        assert os.path.exists(held)
    kept = {p.stem for p in cache.shards.glob("*.tar")}
    assert first.sha256 in kept and second.sha256 not in kept and len(kept) <= 3
    assert sum(p.stat().st_size for p in cache.shards.glob("*.tar")) <= 3 * size + 10


def test_a_fetched_copy_takes_the_place_of_its_reservation_only_under_the_room_lock(index, tmp_path):
    """Room is counted as the copies, then the fetches under way: a fetch that became a copy between the two reads
    would be counted in neither, and let another fetch's reservation past the cap. So its rename waits for whoever
    counts room (here the test, holding the room lock), then happens."""
    import fcntl
    import threading

    slow = slow_index(index, tmp_path / "slow" / "index.json", tmp_path / "reads.log", 5e3)  # about 1.2 s a shard
    cache = ShardCache(tmp_path / "cache", max_bytes=10 * max(s.bytes for s in slow.shards))
    info = slow.shards[0]
    def fetch() -> None:
        with cache.location(slow, info):
            pass

    fetched = threading.Thread(target=fetch)
    fetched.start()
    wait_until(lambda: list(cache.shards.glob(".*.tmp")), 30, 0.01, "the fetch's reservation")
    with cache._lock("node", "room", fcntl.LOCK_EX):  # taken while its bytes come
        time.sleep(2.5)  # they have come and been checked meanwhile
        assert not cache.path(info.sha256).exists() and len(list(cache.shards.glob(".*.tmp"))) == 1
    fetched.join(30)
    assert cache.path(info.sha256).exists() and list(cache.shards.glob(".*.tmp")) == []


def read_capped(root: str, index_path: str, cap: int, start: int) -> None:
    from hpctrain.data.index import load_index

    index = load_index(index_path)
    cache = ShardCache(root, max_bytes=cap)
    for info in index.shards[start:] + index.shards[:start]:
        with cache.location(index, info):
            pass


def test_processes_fetching_different_shards_at_once_stay_under_the_cap_together(slow, tmp_path):
    """Four processes, each starting at a different shard, through a cache of three: at no moment do the copies
    and the fetches under way hold more than the cap (each fetch counts the others' reservations)."""
    cap = 3 * max(s.bytes for s in slow.shards)
    shards, most = tmp_path / "cache" / f"hpctrain-{os.getuid()}" / "shards", 0
    with multiprocessing.get_context("fork").Pool(4) as pool:
        done = pool.starmap_async(read_capped, [(str(tmp_path / "cache"), str(slow.path), cap, 3 * k)
                                                for k in range(4)])
        while not done.ready():
            held = 0
            for path in shards.glob("*"):
                if path.suffix != ".ok" and ".ok." not in path.name:
                    with contextlib.suppress(OSError):
                        held += path.stat().st_size
            most = max(most, held)
            time.sleep(0.002)
        done.get()
    assert most <= cap, (most, cap)
    assert Counter(name for name, _ in reads(tmp_path / "reads.log")).total() > len(slow.shards)  # it evicted


def fetch_forever(root: str, index_path: str) -> None:
    from hpctrain.data.index import load_index

    index = load_index(index_path)
    with ShardCache(root).location(index, index.shards[0]):
        pass


def test_a_fetch_killed_midway_leaves_nothing_a_reader_trusts(index, tmp_path):
    crawl = slow_index(index, tmp_path / "crawl" / "index.json", tmp_path / "reads.log", 500)  # 12 s a shard
    killed = multiprocessing.get_context("fork").Process(target=fetch_forever, args=(str(tmp_path / "cache"),
                                                                                     str(crawl.path)))
    killed.start()
    cache = ShardCache(tmp_path / "cache")
    wait_until(lambda: list(cache.shards.glob(".*.tmp")) and list(cache.shards.glob(".*.tmp"))[0].stat().st_size,
               60, 0.05, "the fetch to write")
    os.kill(killed.pid, signal.SIGKILL)
    killed.join()
    assert not cache.path(index.shards[0].sha256).exists()
    fast = slow_index(index, tmp_path / "fast" / "index.json", tmp_path / "reads.log", RATE)
    with cache.location(fast, fast.shards[0]) as where, Shard(fast, fast.shards[0], where) as shard:
        assert len(list(shard.samples(range(fast.shards[0].samples)))) == fast.shards[0].samples
    assert cache.counts.misses == 1 and not list(cache.shards.glob(".*.tmp"))  # the killed fetch's file cleared


def test_a_cache_that_cannot_be_written_reads_the_source_and_says_so_once(index, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    cache = ShardCache(full, min_free_bytes=1 << 60)  # no disk has that much left
    journal = Journal(tmp_path / "journal")
    loader = ShardLoader(index, **KW, cache=cache, journal=journal)
    plain = ShardLoader(index, **KW)
    assert take_across_epochs(loader, 30) == take_across_epochs(plain, 30)
    neighbour = ShardLoader(index, **KW, cache=ShardCache(full, min_free_bytes=1 << 60), journal=journal)
    assert take_across_epochs(neighbour, 5) == take_across_epochs(ShardLoader(index, **KW), 5)  # the node's other rank
    [alert] = [rec for _, rec in journal.records(kinds=("cache_fallback",))]  # one a run and node
    assert "no room for" in alert["message"] and "min_free" in alert["message"]
    assert loader.stats.cache.fallbacks >= 12 and loader.stats.cache.source_bytes == 0
    assert neighbour.stats.cache.fallbacks > 0


def test_the_loader_reads_the_second_epoch_and_a_second_job_from_the_cache_alike(slow, index, tmp_path):
    plain = take_across_epochs(ShardLoader(index, **KW), 50)
    loader = ShardLoader(slow, **KW, cache=ShardCache(tmp_path / "cache"))
    assert take_across_epochs(loader, 25) + take_across_epochs(loader, 25) == plain
    counts = loader.stats.cache
    assert counts.misses == 12 and counts.hits >= 12 and counts.source_bytes == sum(s.bytes for s in index.shards)
    log = tmp_path / "reads.log"
    assert len(reads(log)) == 12
    second = ShardLoader(slow, **KW, cache=ShardCache(tmp_path / "cache"))
    assert take_across_epochs(second, 50) == plain and len(reads(log)) == 12
    assert second.stats.cache.source_bytes == 0 and second.stats.metrics()["cache_hits"] >= 24


def test_a_source_whose_bytes_differ_from_the_index_is_quarantined_not_cached(index, tmp_path):
    bad = index.shard_path(index.shards[2])
    flip_byte(bad, 700)  # the tar still reads; only the sha256 tells
    journal = Journal(tmp_path / "journal")
    loader = ShardLoader(index, **KW, cache=ShardCache(tmp_path / "cache"), journal=journal,
                         max_quarantined_fraction=0.1)
    keys = take_across_epochs(loader, 23)
    assert len(keys) == 100 - index.shards[2].samples
    assert not ShardCache(tmp_path / "cache").path(index.shards[2].sha256).exists()
    [record] = [rec for _, rec in journal.records(kinds=("shard_quarantined",))]
    assert "do not match the index" in record["message"] and record["shard"] == index.shards[2].name


def test_a_worker_fetches_its_next_shard_ahead_and_no_further_than_asked(slow, tmp_path):
    cache = ShardCache(tmp_path / "cache")
    ahead = Prefetcher(cache, slow, slow.shards[:5], ahead_bytes=1)  # always the next shard, never more
    try:
        ahead.reading(0)
        wait_until(lambda: cache.path(slow.shards[1].sha256).exists(), 30, 0.02, "the next shard")
        time.sleep(0.5)
        assert not any(cache.path(s.sha256).exists() for s in (slow.shards[0], *slow.shards[2:]))
        ahead.reading(1)
        wait_until(lambda: cache.path(slow.shards[2].sha256).exists(), 30, 0.02, "the shard after")
    finally:
        ahead.stop()
    counts = ahead.taken()
    assert counts.misses == 2 and counts.hits == 0 and counts.fetch_wait_s == 0


def test_with_prefetch_the_loader_still_fetches_each_shard_once_and_reads_bitwise(slow, index, tmp_path):
    plain = take_across_epochs(ShardLoader(index, **KW), 50)
    loader = ShardLoader(slow, **KW, cache=ShardCache(tmp_path / "cache", prefetch_bytes=1 << 20))
    assert take_across_epochs(loader, 50) == plain
    assert Counter(name for name, _ in reads(tmp_path / "reads.log")) == {s.name: 1 for s in index.shards}
    assert loader.stats.cache.misses == 12 and loader.stats.cache.source_bytes == sum(s.bytes for s in index.shards)


def test_the_cache_command_lists_verifies_and_clears_this_hosts_copies(slow, tmp_path):
    site = tmp_path / "site.toml"
    site.write_text((REPO / "site_configs" / "dev.toml").read_text() + f'\n[cache]\ndir = "{tmp_path}/cache"\n')
    cache = ShardCache(tmp_path / "cache")
    read_all(cache, slow)
    flip_byte(cache.path(slow.shards[5].sha256), 700)
    listed = json.loads(run_cli("cache", "ls", "--site", str(site), "--json").stdout)
    assert listed["dir"] == str(cache.dir) and len(listed["copies"]) == 12
    assert sum(not c["verified"] for c in listed["copies"]) == 1  # the changed one: its ctime moved
    verified = run_cli("cache", "verify", "--site", str(site))
    assert verified.returncode == 1 and "11 copies verified, 1 corrupt (removed)" in verified.stdout
    with cache.location(slow, slow.shards[0]):  # read now: kept
        cleared = json.loads(run_cli("cache", "clear", "--site", str(site), "--json").stdout)
    assert cleared["removed"] == 10 and cleared["in_use"] == 1 and [p.stem for p in cache.shards.glob("*.tar")] == \
        [slow.shards[0].sha256]
    unset = tmp_path / "unset.toml"
    unset.write_text(site.read_text().replace(f"{tmp_path}/cache", "/var/tmp/${HPCTRAIN_NO_SUCH_VARIABLE}"))
    refused = run_cli("cache", "ls", "--site", str(unset))
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "hpctrain: error: [cache] dir '/var/tmp/${HPCTRAIN_NO_SUCH_VARIABLE}' is "
        "'/var/tmp/${HPCTRAIN_NO_SUCH_VARIABLE}' on this host: give --node NODE to look on a compute node")
    assert run_cli("cache", "ls", "--node", "-n1", "--site", str(site)).stderr.strip() == \
        "hpctrain: error: '-n1': not a node name"
