"""The commit protocol, async saves, retention and journal records (ranks simulated by threads)."""

import json
import os
import stat
import threading

import numpy as np
import pytest

import hpctrain.checkpoint.checkpointer as checkpointer_module
from hpctrain.checkpoint import Checkpointer, Retention, Shard, latest_valid, load
from hpctrain.checkpoint.commit import write_fragment, write_skip
from hpctrain.checkpoint.manifest import VERSION, Manifest, sha256
from hpctrain.checkpoint.naming import list_dirs, tmp_name
from hpctrain.errors import CheckpointError
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table

from helpers.checkpoint import chunk_file, ranks_save, same_bits


def test_two_ranks_each_write_their_slice_and_rank0_commits(tmp_path):
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    states = [{"w": Shard(w[2 * r:2 * r + 2], (4, 6), (2 * r, 0)), "b": np.ones(3)} for r in range(2)]
    results = ranks_save(tmp_path, states)
    assert results[0] == tmp_path / "step_00000001" and results[1] is None
    assert [d.path.name for d in list_dirs(tmp_path, kind=None)] == ["step_00000001"]
    assert same_bits(load(results[0], {"w": np.zeros((4, 6), np.float32)})["w"], w)
    tensors = Manifest.read(results[0]).tensors
    assert {i: c.rank for i, c in tensors["w"].chunks.items()} == {(0, 0): 0, (1, 0): 1}
    assert {i: c.rank for i, c in tensors["b"].chunks.items()} == {(0,): 0}  # replicated: rank 0 only


def test_a_chunk_no_rank_writes_or_two_ranks_write_is_refused_and_nothing_commits(tmp_path):
    w = np.zeros((4, 2), np.float32)
    gap = [{"w": Shard(w[:2], (4, 2), (0, 0)), "x": np.ones(1)}, {"w": Shard(w[2:], (4, 2), (2, 0), write=False)}]
    with pytest.raises(CheckpointError, match="tensor 'w': 1 of 2 chunks written by no rank"):
        ranks_save(tmp_path / "gap", gap)
    overlap = [{"w": Shard(w[:2], (4, 2), (0, 0))}] + [{"w": Shard(w[2:], (4, 2), (2, 0))}] * 2
    with pytest.raises(CheckpointError, match=r"tensor 'w': chunk \(1, 0\) written by ranks 1 and 2"):
        ranks_save(tmp_path / "overlap", overlap)
    assert latest_valid(tmp_path / "gap") is None and latest_valid(tmp_path / "overlap") is None


def test_a_rank_that_fails_to_write_makes_the_committer_fail_at_once_naming_it(tmp_path):
    w = np.zeros((4, 2), np.float32)
    states = [{"w": Shard(w[:2], (4, 2), (0, 0))}, {"w": Shard(w[1:3], (4, 2), (1, 0))}]
    with pytest.raises(CheckpointError, match=r"rank-1 failed: shard of 'w' at offset \(1, 0\)"):
        ranks_save(tmp_path, states, commit_timeout_s=60)
    assert latest_valid(tmp_path) is None


def test_committer_times_out_with_the_missing_ranks_named(tmp_path):
    ck = Checkpointer(tmp_path, rank=0, world_size=3, attempt="a1", commit_timeout_s=0.2, journal=None)
    with pytest.raises(CheckpointError, match=r"rank\(s\) \[1, 2\] did not finish writing within 0.2 s"):
        ck.save(1, {"x": np.ones(2)})
    assert latest_valid(tmp_path) is None


def test_a_rank_that_skips_makes_the_committer_abandon_the_step(tmp_path):
    write_skip(tmp_path / tmp_name(1, "a1.1"), rank=1)
    with Checkpointer(tmp_path, rank=0, world_size=2, attempt="a1", commit_timeout_s=30, journal=None) as ck:
        assert ck.save(1, {"x": np.ones(2)}).result() is None
    assert latest_valid(tmp_path) is None


def test_directory_without_manifest_and_tmp_directories_are_never_trusted_and_get_cleaned(tmp_path):
    good = Checkpointer(tmp_path, journal=None).save(1, {"x": np.ones(2)}).result()
    newer = tmp_path / "step_00000002"
    (newer / "tensors").mkdir(parents=True)
    fake_tmp = tmp_path / "step_00000003.tmp-other.1"
    fake_tmp.mkdir()
    (fake_tmp / "manifest.json").write_text((good / "manifest.json").read_text())
    assert latest_valid(tmp_path) == good
    Checkpointer(tmp_path, journal=None).close()  # a new attempt cleans the old attempt's tmp directories
    assert not fake_tmp.exists() and newer.exists()


def test_async_save_snapshots_the_state_so_later_changes_do_not_leak_in(tmp_path):
    w = np.arange(1000, dtype=np.float32)
    with Checkpointer(tmp_path, retention=Retention(keep_last=5), journal=None) as ck:
        for step in (1, 2, 3):  # later saves reuse the host buffers of earlier ones
            ck.save(step, {"w": w}, async_=True)
            w += 1  # the next training step, while the write may still be running
    for step in (1, 2, 3):
        saved = load(tmp_path / f"step_{step:08d}", to="numpy")["w"]
        assert same_bits(saved, np.arange(1000, dtype=np.float32) + step - 1)


def test_background_errors_surface_in_wait_and_in_the_next_save(tmp_path, monkeypatch):
    def broken(root, pieces):
        raise CheckpointError("disk on fire")

    monkeypatch.setattr(checkpointer_module, "write_pieces", broken)
    ck = Checkpointer(tmp_path, journal=None)
    ck.save(1, {"w": np.ones(2)}, async_=True)
    with pytest.raises(CheckpointError, match="disk on fire"):
        ck.wait()
    ck.save(2, {"w": np.ones(2)}, async_=True)
    with pytest.raises(CheckpointError, match="disk on fire"):
        ck.save(3, {"w": np.ones(2)}, async_=True)
    ck.close()


def test_skip_policy_drops_a_save_while_one_is_in_flight(tmp_path, monkeypatch):
    release = threading.Event()
    real = checkpointer_module.write_pieces

    def slow(root, pieces):
        release.wait(30)
        return real(root, pieces)

    monkeypatch.setattr(checkpointer_module, "write_pieces", slow)
    with Checkpointer(tmp_path, if_busy="skip", journal=None) as ck:
        first = ck.save(1, {"w": np.ones(2)}, async_=True)
        assert ck.save(2, {"w": np.ones(2)}, async_=True).result() is None
        release.set()
        assert first.result() == tmp_path / "step_00000001"
    assert [d.step for d in list_dirs(tmp_path, kind=None)] == [1]


def test_saving_a_committed_step_again_keeps_the_first(tmp_path):
    with Checkpointer(tmp_path, journal=None) as ck:
        first = ck.save(5, {"w": np.zeros(2)}).result()
        assert ck.save(5, {"w": np.ones(2)}).result() == first
    assert same_bits(load(first, to="numpy")["w"], np.zeros(2))
    assert [d.path.name for d in list_dirs(tmp_path, kind=None)] == ["step_00000005"]


def test_retention_keeps_last_k_and_best_and_journals_each_state(tmp_path):
    journal = Journal(tmp_path / "journal")
    policy = Retention(keep_last=2, keep_best=1, metric="loss", mode="min")
    with Checkpointer(tmp_path / "ck", retention=policy, journal=journal) as ck:
        for step, loss in zip(range(1, 6), [5.0, 1.0, 4.0, 3.0, 2.0]):
            ck.save(step, {"w": np.full(3, step)}, metrics={"loss": loss}, async_=step % 2 == 0)
    assert [d.step for d in list_dirs(tmp_path / "ck")] == [2, 4, 5]
    records = [r for _, r in journal.records()]
    committed = [r for r in records if r["state"] == "committed"]
    assert [r["step"] for r in committed] == [1, 2, 3, 4, 5]
    last = committed[-1]
    assert (last["metric_name"], last["metric_value"], last["bytes"]) == ("loss", 2.0, 24)
    assert last["manifest_sha256"] == sha256(tmp_path / "ck" / "step_00000005" / "manifest.json")
    assert sorted(r["step"] for r in records if r["state"] == "deleted") == [1, 3]
    with Ledger(tmp_path / "l.db") as ledger:
        ingest_journal(ledger, journal)
        assert {r["step"]: r["state"] for r in Table(ledger, "checkpoints").rows()} == {
            1: "deleted", 2: "committed", 3: "deleted", 4: "committed", 5: "committed"}


def test_retention_counts_only_valid_checkpoints_so_the_newest_valid_survives(tmp_path):
    with Checkpointer(tmp_path, retention=Retention(keep_last=1), journal=None) as ck:
        ck.save(10, {"w": np.ones(4)})
        chunk_file(tmp_path / "step_00000010", "w").write_bytes(b"")  # a newer step, now corrupt
        ck.save(2, {"w": np.ones(4)})
        ck.save(3, {"w": np.ones(4)})
    assert [d.step for d in list_dirs(tmp_path)] == [3, 10]
    assert latest_valid(tmp_path) == tmp_path / "step_00000003"


def test_retention_deletes_nothing_while_a_registration_holds_the_pins(tmp_path, monkeypatch):
    """The pin lock held elsewhere (a registration deciding): the save keeps every checkpoint, the next one retries."""
    import hpctrain.checkpoint.retention as retention
    from hpctrain.files import exclusive_lock

    monkeypatch.setattr(retention, "PIN_WAIT_S", 0.2, raising=False)
    (tmp_path / ".pinned").mkdir()
    with Checkpointer(tmp_path, retention=Retention(keep_last=1), journal=None) as ck:
        ck.save(1, {"w": np.ones(4)})
        with exclusive_lock(tmp_path / ".pinned" / ".lock", 1):
            ck.save(2, {"w": np.ones(4)})
        assert [d.step for d in list_dirs(tmp_path)] == [1, 2]
        ck.save(3, {"w": np.ones(4)})
    assert [d.step for d in list_dirs(tmp_path)] == [3]


def test_retention_never_deletes_a_checkpoint_of_a_newer_format(tmp_path):
    with Checkpointer(tmp_path, retention=Retention(keep_last=1), journal=None) as ck:
        ck.save(1, {"w": np.ones(4)})
        manifest = tmp_path / "step_00000001" / "manifest.json"
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "version": VERSION + 1}))
        ck.save(2, {"w": np.ones(4)})
        ck.save(3, {"w": np.ones(4)})
    assert [d.step for d in list_dirs(tmp_path)] == [1, 3]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("kw, mode", [({}, 0o600), ({"mode": 0o640}, 0o640)])
def test_manifest_and_fragments_are_owner_only_unless_asked_otherwise(tmp_path, umask_022, kw, mode):
    w = np.zeros((4, 2), np.float32)
    path = ranks_save(tmp_path, [{"w": Shard(w[2 * r:2 * r + 2], (4, 2), (2 * r, 0))} for r in range(2)], **kw)[0]
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in path.glob("*.json")} == {
        "manifest.json": mode, "rank-0.json": mode, "rank-1.json": mode, "zarr.json": mode}


@pytest.mark.parametrize("keep_last, keep_best, metric, mode", [(0, 0, None, "min"), (1, 1, None, "min"),
                                                                (1, 0, None, "median")])
def test_retention_policy_rejects_nonsense(keep_last, keep_best, metric, mode):
    with pytest.raises(ValueError):
        Retention(keep_last, keep_best, metric, mode)


def test_retention_best_by_max_ignores_missing_and_nan_metrics():
    policy = Retention(keep_last=1, keep_best=2, metric="acc", mode="max")
    assert policy.doomed({1: 0.9, 2: float("nan"), 3: None, 4: 0.7, 5: 0.8, 6: 0.1}) == [2, 3, 4]


def test_resume_returns_cursor_and_rng_and_later_saves_name_their_parent(tmp_path):
    with Checkpointer(tmp_path, journal=None) as ck:
        ck.save(4, {"w": np.ones(2)}, cursor={"sample": 400})
    with Checkpointer(tmp_path, journal=None) as ck:
        restored = ck.load_latest(to="numpy")
        assert (restored.step, restored.cursor) == (4, {"sample": 400}) and "python" in restored.rng
        path = ck.save(5, {"w": np.ones(2)}).result()
    assert Manifest.read(path).data["lineage"] == {"parent": "step_00000004"}


def test_step_directories_sort_numerically_with_or_without_padding(tmp_path):
    with Checkpointer(tmp_path, retention=Retention(keep_last=5), journal=None) as ck:
        for step in (9, 10):
            ck.save(step, {"w": np.full(2, step)})
    (tmp_path / "step_00000009").rename(tmp_path / "step_9")
    (tmp_path / "step_00000010").rename(tmp_path / "step_10")
    assert latest_valid(tmp_path) == tmp_path / "step_10"
    assert same_bits(load(latest_valid(tmp_path), to="numpy")["w"], np.full(2, 10))


def test_a_fragment_committed_the_moment_it_appears_is_not_a_failure(tmp_path, monkeypatch):
    # The committing rank may rename the save's directory as soon as the last fragment's name appears,
    # before the rank that wrote it syncs the directory.
    import hpctrain.files

    tmp = tmp_path / tmp_name(5, "a.1")
    tmp.mkdir()
    replace = os.replace

    def replace_then_commit(src, dst):
        replace(src, dst)
        if str(dst).endswith("rank-1.json"):
            tmp.rename(tmp_path / "step_00000005")

    monkeypatch.setattr(hpctrain.files.os, "replace", replace_then_commit)
    write_fragment(tmp, 1, {"tensors": {}}, mode=0o600)
    assert json.loads((tmp_path / "step_00000005" / "rank-1.json").read_text())["rank"] == 1


def test_a_save_fsyncs_every_folder_from_its_own_down_to_each_chunk_and_none_above(tmp_path, monkeypatch):
    """A chunk file's writer fsyncs it, and tensorstore the folders of its own files, not the ones it made above
    them: the writer fsyncs each folder between the checkpoint's and a chunk file once, and no folder outside it."""
    import hpctrain.checkpoint.writer as writer

    synced = []
    monkeypatch.setattr(writer, "fsync_dir", synced.append)
    with Checkpointer(tmp_path / "ck", journal=None) as ck:
        ck.save(1, {"a": np.ones((4, 4), np.float32), "nested": {"b": np.zeros(3)}})
    final = tmp_path / "ck" / "step_00000001"
    chunks = [p.relative_to(final) for p in (final / "tensors").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert len(chunks) == 2
    root = min(synced, key=lambda d: len(d.parts))  # the checkpoint's folder, as it was named while written
    assert len(synced) == len(set(synced)) and all(d.is_relative_to(root) for d in synced)
    assert {d.relative_to(root) for d in synced} == {parent for c in chunks for parent in c.parents}
