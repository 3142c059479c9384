"""The registry under races: a registration that pins while retention decides either keeps its checkpoint or fails
(never a version whose checkpoint is gone); a failed registration leaves no pin; one checkpoint is one version of a
model however many registrations run; a move decided on an alias that moved away and back is refused (ABA)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import types

import pytest

import hpctrain.files
from hpctrain.checkpoint.pins import pins
from hpctrain.errors import CheckpointError
from hpctrain.ledger import Ledger
from hpctrain.ledger.registry import Registry
from hpctrain.registry.aliases import decide, history, promote, rollback
from hpctrain.registry.names import RegistryError
from hpctrain.registry.versions import register

from helpers.registry import evaluated, job_with_checkpoints

# Retention (keep_last=1) in a process of its own that stops before its first trash until told to go on.
RETENTION = """
import sys
from pathlib import Path
from hpctrain.checkpoint import retention
real = retention.to_trash
def held(path, step, tag):
    if not held.told:
        held.told = True
        print("deciding", flush=True)
        sys.stdin.readline()
    return real(path, step, tag)
held.told = False
retention.to_trash = held
retention.apply_retention(Path(sys.argv[1]), retention.Retention(keep_last=1), "t.1", None)
"""


def test_a_registration_while_retention_decides_keeps_its_checkpoint_or_fails(isolated_ledger, tmp_path, monkeypatch):
    """Retention has read the pins and is about to trash steps 1 and 2 when step 2 is registered: the registration
    waits for it and then finds its checkpoint gone; it never makes a version of a deleted checkpoint."""
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run", (1, 2, 3))
    ckpt = tmp_path / "run" / "step_00000002"
    deciding = subprocess.Popen([sys.executable, "-c", RETENTION, str(tmp_path / "run")], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    assert deciding.stdout and deciding.stdin and deciding.stdout.readline() == "deciding\n"
    settled = threading.Event()  # the registration is done, or it waits for a lock that retention holds
    waits = types.SimpleNamespace(monotonic=time.monotonic, sleep=lambda s: (settled.set(), time.sleep(s)))
    monkeypatch.setattr(hpctrain.files, "time", waits)
    outcome: list[object] = []

    def registering() -> None:
        try:
            with Ledger(isolated_ledger) as mine:
                outcome.append(register(mine, "gpt", job, step=2))
        except Exception as exc:
            outcome.append(exc)
        settled.set()

    thread = threading.Thread(target=registering)
    thread.start()
    settled.wait()
    deciding.stdin.write("go\n")
    deciding.stdin.close()
    assert deciding.wait(timeout=60) == 0
    thread.join()
    with Ledger(isolated_ledger) as ledger:
        versions = ledger.registry.versions("gpt") if ledger.registry.model("gpt") else []
    if versions:
        assert ckpt.is_dir(), "a version whose checkpoint retention deleted"
    else:
        assert isinstance(outcome[0], CheckpointError) and "gone" in str(outcome[0])
        assert pins(ckpt) == []


def test_a_failed_registration_leaves_no_pin(isolated_ledger, tmp_path, monkeypatch):
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run", (2,))

        def refused(*args: object) -> None:
            raise OSError("disk I/O error")

        monkeypatch.setattr(Registry, "add_version", refused)
        with pytest.raises(OSError, match="disk I/O error"):
            register(ledger, "gpt", job)
    assert pins(tmp_path / "run" / "step_00000002") == []


def test_one_checkpoint_is_one_version_of_a_model(isolated_ledger, tmp_path):
    """Two registrations that both found no version yet add one; the ledger itself refuses a second row."""
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run", (2,))
        first = register(ledger, "gpt", job)
        model = ledger.registry.model("gpt")
        columns = {k: v for k, v in first.items() if k not in ("model", "version")}
        assert ledger.registry.add_version(model, columns) == (1, False)
        with pytest.raises(Exception, match="a version of this model already"):
            ledger.db.execute("INSERT INTO model_versions SELECT model, 2, job_id, task_index, step, checkpoint, "
                              "manifest_sha256, lineage_json, registered_at, registered_by FROM model_versions")
        assert register(ledger, "gpt", job) == first and len(ledger.registry.versions("gpt")) == 1


@pytest.fixture
def promoted_twice(isolated_ledger, tmp_path):
    """gpt@production: none -> 1 -> 2 (both through the gate)."""
    with Ledger(isolated_ledger) as ledger:
        for number, loss in ((1, 2.0), (2, 1.5)):
            job = job_with_checkpoints(ledger, tmp_path, f"run-{number}", (10,))
            evaluated(ledger, job, 10, loss)
            register(ledger, "gpt", job)
        for version in (1, 2):
            promote(ledger, decide(ledger, "gpt", version, "production"))
    return isolated_ledger


def test_a_rollback_decided_before_the_alias_moved_away_and_back_is_refused(promoted_twice, monkeypatch):
    """While a rollback decides to undo move 2, another rolls it back and move 2's version is promoted again: the
    alias points where it did, but the first rollback would undo move 2 twice. It is refused, and the next
    rollback undoes the newest promotion."""
    real = Registry.move

    def meanwhile(self: Registry, *args: object) -> object:
        monkeypatch.setattr(Registry, "move", real)
        with Ledger(promoted_twice) as other:
            rollback(other, "gpt", "production")
            promote(other, decide(other, "gpt", 2, "production"))
        return real(self, *args)

    with Ledger(promoted_twice) as ledger:
        monkeypatch.setattr(Registry, "move", meanwhile)
        with pytest.raises(RegistryError, match="while this was decided; nothing changed"):
            rollback(ledger, "gpt", "production")
        moves = history(ledger, "gpt", "production")
        assert [(m["action"], m["to_version"]) for m in moves] == [
            ("promote", 1), ("promote", 2), ("rollback", 1), ("promote", 2)]
        assert rollback(ledger, "gpt", "production")["undoes"] == moves[3]["id"]
        assert ledger.registry.alias("gpt", "production")["version"] == 1


def test_a_promotion_decided_before_the_alias_moved_away_and_back_is_refused(promoted_twice):
    with Ledger(promoted_twice) as ledger:
        stale = decide(ledger, "gpt", 1, "staging")
        promote(ledger, decide(ledger, "gpt", 2, "staging"))
        rollback(ledger, "gpt", "staging")  # staging is nowhere again, as when ``stale`` was decided
        with pytest.raises(RegistryError, match="while this was decided"):
            promote(ledger, stale)
        assert ledger.registry.alias("gpt", "staging") is None
