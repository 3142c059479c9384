"""The registry's commands killed at every step and run again, and two copies run at once: `model register`,
`model promote` (forced too), `model rollback` and `model export` (helpers.faults). After each, the registry holds:
each model's versions numbered 1..n, one per checkpoint, each pinned, and no pin without a version; each alias's
moves one chain (a move from where the one before went), the alias where the last one took it, at a version that
passed the gate or was forced there, no move undone twice; an export folder absent or complete with the checksums of
its manifest, and no hidden folder left once an export completed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpctrain.checkpoint.pins import PINS, pin_records, pins
from hpctrain.ledger import Ledger
from hpctrain.registry.aliases import decide, gate_numbers, promote, rollback
from hpctrain.registry.names import RegistryError
from hpctrain.registry.versions import register

from helpers.faults import Fault, Forker, Run, Snapshot, kill_at_every_step
from helpers.registry import evaluated, job_with_checkpoints

WARM = ("hpctrain.cli.model", "hpctrain.registry.export", "hpctrain.registry.aliases", "hpctrain.checkpoint.reader")


@pytest.fixture(scope="module")
def forker():
    with Forker(*WARM) as warm:
        yield warm


@pytest.fixture
def world(tmp_path, monkeypatch) -> Path:
    """A folder holding the ledger (HPCTRAIN_LEDGER), the jobs' checkpoints and the exports' folder."""
    world = tmp_path / "world"
    (world / "exports").mkdir(parents=True)
    monkeypatch.setenv("HPCTRAIN_LEDGER", str(world / "ledger.db"))
    return world


def versions_with_losses(world: Path, losses: tuple[float | None, ...], promoted: tuple[int, ...] = ()) -> None:
    """gpt:1, gpt:2, ... each of a job of its own (run-N, checkpoint of step 10) with its eval/loss (None: none);
    gpt@production promoted through ``promoted`` in order."""
    with Ledger(world / "ledger.db") as ledger:
        for number, loss in enumerate(losses, 1):
            job = job_with_checkpoints(ledger, world, f"run-{number}", (10,))
            if loss is not None:
                evaluated(ledger, job, 10, loss)
            assert register(ledger, "gpt", job)["version"] == number
        for version in promoted:
            promote(ledger, decide(ledger, "gpt", version, "production"))


def registry_holds(world: Path) -> list[tuple[str, int | None, int | None]]:
    """Check the registry's invariants; gpt@production's moves (action, from, to)."""
    with Ledger(world / "ledger.db") as ledger:
        for model in ledger.registry.models():
            name = model["name"]
            versions = ledger.registry.versions(name)
            assert [v["version"] for v in versions] == list(range(1, len(versions) + 1))
            keys = [(v["job_id"], v["task_index"], v["step"]) for v in versions]
            assert len(set(keys)) == len(keys), f"a checkpoint is two versions of {name}"
            assert all(name in pins(Path(v["checkpoint"])) for v in versions), "a version's checkpoint is not pinned"
            aliases = {m["alias"] for m in ledger.registry.moves(name)}
            assert {a["alias"] for a in ledger.registry.aliases(name)} <= aliases, "an alias that no move moved"
            for alias in aliases:
                moves = ledger.registry.moves(name, alias)
                went = [None] + [m["to_version"] for m in moves]
                assert [m["from_version"] for m in moves] == went[:-1], f"{name}@{alias}'s moves are not one chain"
                row = ledger.registry.alias(name, alias)
                assert (row["version"] if row else None) == went[-1]
                if row:
                    assert any(
                        m["to_version"] == row["version"]
                        and (m["action"] == "force" or m["action"] == "promote" and not gate_numbers(m)["refusal"])
                        for m in moves
                    ), f"{name}@{alias} is at a version neither gated nor forced there"
                undone = [m["undoes"] for m in moves if m["undoes"] is not None]
                assert len(set(undone)) == len(undone), f"a move of {name}@{alias} rolled back twice"
        for folder in world.glob(f"*/{PINS}"):
            for _, label, record in pin_records(folder.parent):
                found = ledger.registry.version_of(label, record["job_id"], record["task_index"], record["step"])
                assert found is not None, f"a pin of {label} without a version: {record}"
            assert list(folder.glob("*/.*")) == [], "pins' temporary files left behind"
        moves = ledger.registry.moves("gpt", "production") if ledger.registry.model("gpt") else []
    return [(m["action"], m["from_version"], m["to_version"]) for m in moves]


def export_holds(out: Path, complete: bool) -> None:
    """``out`` is a whole export that its manifest's checksums verify (or, unless ``complete``, absent); once
    ``complete``, no hidden folder of an export to it is left."""
    if complete:
        assert list(out.parent.glob(f".{out.name}.tmp-*")) == [], "an export's hidden folder left behind"
    if not out.exists() and not complete:
        return
    files = json.loads((out / "manifest.json").read_text())["files"]
    assert sorted(p.name for p in out.iterdir()) == sorted([*files, "manifest.json"])
    for name, digest in files.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, f"{name}: not as its manifest says"


def ok(run: Run, *lines: str) -> str:
    """The run's output line, which must start with one of ``lines`` (exit status 0)."""
    assert run.returncode == 0 and run.stdout.startswith(lines), (run.returncode, run.stdout, run.stderr)
    return run.stdout


def test_a_registration_killed_at_any_step_and_run_again_is_one_version(forker, world):
    """gpt:1 exists; job run-2's checkpoint becomes gpt:2 however the registration is killed: pinned, numbered
    without a gap or a twin, and the pin of a registration killed before its commit is not left without a version."""
    versions_with_losses(world, (2.0,))
    with Ledger(world / "ledger.db") as ledger:
        job = job_with_checkpoints(ledger, world, "run-2", (10,))
    args = ("model", "register", "gpt", str(job))

    def check(killed: Run, again: Run) -> None:
        done = killed.fault is not None and killed.fault.when == "after" and killed.steps[-1] == "commit"
        ok(again, "gpt:2 is already" if done else "registered gpt:2:")
        registry_holds(world)
        with Ledger(world / "ledger.db") as ledger:
            assert [v["job_id"] for v in ledger.registry.versions("gpt")][1:] == [job]

    steps = kill_at_every_step(forker, args, [world / "run-2"], Snapshot(world), check)
    assert steps[-1] == "commit" and any(s.startswith("replace ") for s in steps), steps


@pytest.mark.parametrize(
    "args, move",
    [
        (("model", "promote", "gpt", "2", "--alias", "production"), ("promote", 1, 2)),
        (("model", "promote", "gpt", "3", "--alias", "production", "--force", "--why", "hotfix"), ("force", 1, 3)),
    ],
    ids=["promote", "force"],
)
def test_a_promotion_killed_at_any_step_and_run_again_moves_once(forker, world, args, move):
    versions_with_losses(world, (2.0, 1.5, None), promoted=(1,))

    def check(killed: Run, again: Run) -> None:
        if killed.fault == Fault(1, "after"):  # killed after its commit: it had moved the alias
            ok(again, f"gpt@production is version {move[2]} already; nothing changed")
        else:
            ok(again, f"gpt@production: version 1 -> version {move[2]} ({move[0]};")
        assert registry_holds(world) == [("promote", None, 1), move]

    assert kill_at_every_step(forker, args, [], Snapshot(world), check) == ["commit"]


def test_a_rollback_killed_at_any_step_and_run_again_undoes_a_move_at_a_time(forker, world):
    """Killed before its commit, the rerun is the rollback; killed after it, the rollback was done and the rerun is
    the next one (without ``--undo``, nothing tells a rerun from a second rollback): each undoes one move."""
    versions_with_losses(world, (2.0, 1.5), promoted=(1, 2))
    promoted = [("promote", None, 1), ("promote", 1, 2)]

    def check(killed: Run, again: Run) -> None:
        moves = registry_holds(world)
        if killed.fault == Fault(1, "after"):
            ok(again, "gpt@production: version 1 -> none (rollback;")
            assert moves == [*promoted, ("rollback", 2, 1), ("rollback", 1, None)]
        else:
            ok(again, "gpt@production: version 2 -> version 1 (rollback;")
            assert moves == [*promoted, ("rollback", 2, 1)]

    args = ("model", "rollback", "gpt", "--alias", "production")
    assert kill_at_every_step(forker, args, [], Snapshot(world), check) == ["commit"]


def test_a_rollback_of_a_named_move_killed_at_any_step_and_run_again_undoes_it_once(forker, world):
    versions_with_losses(world, (2.0, 1.5), promoted=(1, 2))

    def check(killed: Run, again: Run) -> None:
        done = killed.fault == Fault(1, "after")
        ok(again, "gpt@production: move 2 is rolled back already" if done else "gpt@production: version 2 -> version 1")
        assert registry_holds(world) == [("promote", None, 1), ("promote", 1, 2), ("rollback", 2, 1)]

    args = ("model", "rollback", "gpt", "--alias", "production", "--undo", "2")
    assert kill_at_every_step(forker, args, [], Snapshot(world), check) == ["commit"]


def test_an_export_killed_at_any_step_is_absent_or_whole_and_run_again_is_one_whole_export(forker, world):
    versions_with_losses(world, (2.0,))
    out = world / "exports" / "out"

    def check(killed: Run, again: Run) -> None:
        done = killed.fault is not None and killed.fault.when == "after" and killed.steps[-1].startswith("replace ")
        ok(again, "already exported gpt:1 to" if done else "exported gpt:1 to")
        export_holds(out, complete=True)
        registry_holds(world)

    steps = kill_at_every_step(
        forker,
        ("model", "export", "gpt", str(out)),
        [world / "exports"],
        Snapshot(world),
        check,
        killed=lambda run: export_holds(out, complete=False),
    )
    assert steps[0].startswith("mkdir ") and steps[-1].startswith(f"replace {out.parent}/.out.tmp-"), steps


ROUNDS = 2  # two at once, from the same world: the order they meet in differs from round to round


def twice_at_once(forker: Forker, world: Snapshot, *args: str) -> Iterator[list[Run]]:
    """`hpctrain ARGS` twice at once, ``ROUNDS`` times from ``world``: the two runs of each (checked before the next)."""
    for _ in range(ROUNDS):
        world.restore()
        yield forker.together(args, args)


def test_two_registrations_of_one_checkpoint_at_once_make_one_version(forker, world):
    versions_with_losses(world, (2.0,))
    with Ledger(world / "ledger.db") as ledger:
        job = job_with_checkpoints(ledger, world, "run-2", (10,))
    for runs in twice_at_once(forker, Snapshot(world), "model", "register", "gpt", str(job)):
        said = sorted(ok(r, "registered gpt:2:", "gpt:2 is already").split(":")[0] for r in runs)
        assert said == ["gpt", "registered gpt"], said  # one made it, the other answers with it
        registry_holds(world)
        with Ledger(world / "ledger.db") as ledger:
            assert len(ledger.registry.versions("gpt")) == 2


def test_two_registrations_of_two_checkpoints_at_once_number_them_without_a_twin(forker, world):
    versions_with_losses(world, (2.0,))
    with Ledger(world / "ledger.db") as ledger:
        jobs = [job_with_checkpoints(ledger, world, f"run-{n}", (10,)) for n in (2, 3)]
    snapshot = Snapshot(world)
    for _ in range(ROUNDS):
        snapshot.restore()
        runs = forker.together(*[("model", "register", "gpt", str(j)) for j in jobs])
        assert sorted(ok(r, "registered gpt:").split(":")[1] for r in runs) == ["2", "3"]
        registry_holds(world)


@pytest.mark.parametrize("versions", [(2, 2), (2, 3)], ids=["same", "different"])
def test_two_promotions_of_one_alias_at_once_record_the_moves_that_happened(forker, world, versions):
    """From gpt@production at 1: both to 2 (one moves it), or to 2 and to 3 (3 is better: one after the other, or
    one refused as decided on what moved meanwhile); every success is one move, every refusal changes nothing."""
    versions_with_losses(world, (2.0, 1.5, 1.0), promoted=(1,))
    snapshot = Snapshot(world)
    for _ in range(ROUNDS):
        snapshot.restore()
        runs = forker.together(*[("model", "promote", "gpt", str(v), "--alias", "production") for v in versions])
        moves = registry_holds(world)
        done = [r for r in runs if r.returncode == 0 and "already" not in r.stdout]
        assert len(moves) == 1 + len(done) and done, [r.stderr for r in runs]
        for r in runs:
            if r.returncode:
                assert r.stderr.startswith("hpctrain: error: ") and r.stderr.count("\n") == 1, r.stderr
                assert any(
                    m in r.stderr for m in ("already", "while this was decided; nothing changed", "worse than")
                ), r.stderr
        said = sorted(r.stdout.split(" (")[0] for r in done)
        assert said == sorted(f"gpt@production: version {a} -> version {b}" for _, a, b in moves[1:]), said


def test_two_forced_promotions_at_once_record_the_moves_that_happened(forker, world):
    versions_with_losses(world, (2.0, 1.5, None), promoted=(2,))
    for runs in twice_at_once(
        forker, Snapshot(world), "model", "promote", "gpt", "3", "--alias", "production", "--force", "--why", "hotfix"
    ):
        moved = [r for r in runs if r.stdout.startswith("gpt@production: version 2 -> version 3 (force;")]
        other = next(r for r in runs if r not in moved)  # saw the move done, or decided before it
        assert len(moved) == 1 and (other.stdout, other.returncode) in (
            ("gpt@production is version 3 already; nothing changed\n", 0), ("", 2)), runs
        assert registry_holds(world) == [("promote", None, 2), ("force", 2, 3)]


def test_two_rollbacks_at_once_undo_each_move_once(forker, world):
    """From none -> 1 -> 2 -> 3: two rollbacks either both succeed, one after the other (3 -> 2 -> 1), or one is
    refused as decided on an alias that moved; never both undoing the same move. Two of move 3 (``--undo 3``)
    undo it once, and both say so."""
    versions_with_losses(world, (3.0, 2.0, 1.0), promoted=(1, 2, 3))
    promoted = [("promote", None, 1), ("promote", 1, 2), ("promote", 2, 3)]
    snapshot = Snapshot(world)
    for runs in twice_at_once(forker, snapshot, "model", "rollback", "gpt", "--alias", "production"):
        moves = registry_holds(world)
        done = sorted(ok(r, "gpt@production: version ") for r in runs if r.returncode == 0)
        assert moves == [*promoted, ("rollback", 3, 2), ("rollback", 2, 1)][: 3 + len(done)], moves
        assert done and all("moved from version 3 to version 2" in r.stderr for r in runs if r.returncode), runs
    for runs in twice_at_once(forker, snapshot, "model", "rollback", "gpt", "--alias", "production", "--undo", "3"):
        said = sorted(ok(r, "gpt@production: ").split(" (")[0] for r in runs)
        assert said == ["gpt@production: move 3 is rolled back already", "gpt@production: version 3 -> version 2"]
        assert registry_holds(world) == [*promoted, ("rollback", 3, 2)]


def test_a_twins_rollback_committed_between_the_reads_of_a_rollback_is_a_moved_alias(world):
    """The interleaving two rollbacks at once met now and then (CI, 2026-12-03): the twin commits its rollback of
    move 3 after this one read where the alias was (version 3) and before it read which promotion stands. Read
    apart, version 3 against move 2 standing said "nothing to roll back"; read in one snapshot, this one is refused
    as decided on an alias that moved, and the next rollback undoes move 2."""
    versions_with_losses(world, (3.0, 2.0, 1.0), promoted=(1, 2, 3))
    with Ledger(world / "ledger.db") as ledger, Ledger(world / "ledger.db") as twin:
        read_standing = ledger.registry.last_move_standing

        def twin_first(model: str, alias: str):
            ledger.registry.last_move_standing = read_standing  # the twin comes once
            rollback(twin, model, alias)
            return read_standing(model, alias)

        ledger.registry.last_move_standing = twin_first
        with pytest.raises(RegistryError, match="moved from version 3 to version 2"):
            rollback(ledger, "gpt", "production")
        assert rollback(ledger, "gpt", "production")["to_version"] == 1
    assert registry_holds(world)[3:] == [("rollback", 3, 2), ("rollback", 2, 1)]


def test_two_exports_to_one_folder_at_once_end_with_one_whole_export(forker, world):
    versions_with_losses(world, (2.0,))
    out = world / "exports" / "out"
    for runs in twice_at_once(forker, Snapshot(world), "model", "export", "gpt", str(out)):
        said = sorted(ok(r, "exported gpt:1 to", "already exported gpt:1 to").split(" gpt")[0] for r in runs)
        assert said == ["already exported", "exported"], said
        export_holds(out, complete=True)
