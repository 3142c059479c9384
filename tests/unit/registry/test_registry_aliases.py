"""Aliases: promotion through the gate (results present, no worse than the alias's target, within the threshold),
forced promotions recorded with their reason, rollbacks walking back, every move in the history, and of two
promotions decided at once exactly one moves the alias."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpctrain.ledger import Ledger
from hpctrain.registry.aliases import basis, decide, history, promote, rollback, undo
from hpctrain.registry.gate import Gate
from hpctrain.registry.names import RegistryError
from hpctrain.registry.versions import register

from helpers.cli import run_cli
from helpers.registry import evaluated, job_with_checkpoints


@pytest.fixture
def three_versions(isolated_ledger, tmp_path):
    """gpt:1 (eval/loss 2.0), gpt:2 (1.5), gpt:3 (no result yet), each of a job of its own."""
    with Ledger(isolated_ledger) as ledger:
        for number, loss in ((1, 2.0), (2, 1.5), (3, None)):
            job = job_with_checkpoints(ledger, tmp_path, f"run-{number}", (10,))
            if loss is not None:
                evaluated(ledger, job, 10, loss)
            assert register(ledger, "gpt", job)["version"] == number
    return isolated_ledger


def test_promotion_rollback_and_history_on_the_command_line(three_versions):
    first = run_cli("model", "promote", "gpt", "1", "--alias", "production")
    assert first.returncode == 0 and "gpt@production: none -> version 1 (promote; eval/loss 2 vs -)" in first.stdout
    better = run_cli("model", "promote", "gpt", "2", "--alias", "production")
    assert better.returncode == 0 and "version 1 -> version 2 (promote; eval/loss 1.5 vs 2)" in better.stdout
    worse = run_cli("model", "promote", "gpt", "1", "--alias", "production")
    assert worse.returncode == 2 and worse.stderr == (
        "hpctrain: error: not promoted: gpt:1 has eval/loss 2, worse than gpt@production (gpt:2) at 1.5\n")
    unevaluated = run_cli("model", "promote", "gpt", "3", "--alias", "production")
    assert unevaluated.returncode == 2 and "gpt:3 has no heldout result for eval/loss" in unevaluated.stderr
    assert "hpctrain eval" in unevaluated.stderr and unevaluated.stderr.count("\n") == 1
    no_reason = run_cli("model", "promote", "gpt", "3", "--alias", "production", "--force")
    assert no_reason.returncode == 2 and "needs a reason (--why TEXT)" in no_reason.stderr
    forced = run_cli("model", "promote", "gpt", "3", "--alias", "production", "--force", "--why", "hotfix tokenizer")
    assert forced.returncode == 0 and "(force; eval/loss - vs 1.5); the gate refused: gpt:3 has no" in forced.stdout
    back = run_cli("model", "rollback", "gpt", "--alias", "production", "--why", "bad outputs")
    assert back.returncode == 0 and back.stdout == (  # not re-gated, and says why in the same line
        "gpt@production: version 3 -> version 2 (rollback; not re-gated: version 2 passed the gate when move 2 "
        "promoted it)\n")
    shown = run_cli("model", "show", "gpt@production")
    assert shown.returncode == 0 and shown.stdout.startswith("gpt:2 (production)")
    moves = json.loads(run_cli("model", "history", "gpt", "--json").stdout)
    assert [(m["action"], m["from_version"], m["to_version"], m["why"]) for m in moves] == [
        ("promote", None, 1, None), ("promote", 1, 2, None), ("force", 2, 3, "hotfix tokenizer"),
        ("rollback", 3, 2, "bad outputs")]
    assert moves[2]["gate_json"]["refusal"].startswith("gpt:3 has no heldout result")
    assert moves[1]["gate_json"]["candidate"] == 1.5 and moves[1]["gate_json"]["current"] == 2.0
    assert all(m["by"] and m["at"] for m in moves) and moves[3]["undoes"] == moves[2]["id"]
    assert moves[3]["gate_json"]["regated"] is False and moves[3]["gate_json"]["candidate"] == 1.5
    assert moves[3]["gate_json"]["basis"].startswith("not re-gated: version 2 passed the gate")
    table = run_cli("model", "history", "gpt")
    assert table.returncode == 0 and "hotfix tokenizer" in table.stdout and "rollback" in table.stdout
    listed = run_cli("model", "ls")
    assert listed.returncode == 0 and "production: 2" in listed.stdout and "heldout eval/loss" in listed.stdout


def test_rollbacks_walk_back_through_the_promotions_and_then_stop(three_versions):
    with Ledger(three_versions) as ledger:
        for version in (1, 2):
            promote(ledger, decide(ledger, "gpt", version, "production"))
        assert rollback(ledger, "gpt", "production")["to_version"] == 1
        assert basis(rollback(ledger, "gpt", "production")) == "the alias is removed"
        assert ledger.registry.alias("gpt", "production") is None
        with pytest.raises(RegistryError, match="nothing to roll back"):
            rollback(ledger, "gpt", "production")
        assert [m["action"] for m in history(ledger, "gpt", "production")] == ["promote"] * 2 + ["rollback"] * 2


def test_a_rollback_of_a_named_move_undoes_it_once(three_versions):
    """``--undo MOVE``: only the newest promotion standing; run again, the rollback that undid it, nothing changed."""
    with Ledger(three_versions) as ledger:
        for version in (1, 2):
            promote(ledger, decide(ledger, "gpt", version, "production"))
        with pytest.raises(RegistryError, match="move 1 is not the newest promotion standing [(]move 2 is[)]"):
            undo(ledger, "gpt", "production", move=1)
        done, now = undo(ledger, "gpt", "production", move=2)
        assert now and (done["undoes"], done["to_version"]) == (2, 1)
        assert undo(ledger, "gpt", "production", move=2) == (done, False)
        with pytest.raises(RegistryError, match=f"move {done['id']} is none of its promotions"):
            undo(ledger, "gpt", "production", move=done["id"])
        assert [m["action"] for m in history(ledger, "gpt")] == ["promote", "promote", "rollback"]
    again = run_cli("model", "rollback", "gpt", "--alias", "production", "--undo", "2")
    assert again.returncode == 0 and again.stdout == (
        "gpt@production: move 2 is rolled back already (move 3: version 2 -> version 1)\n")
    header = next(line for line in run_cli("model", "history", "gpt").stdout.splitlines() if " when " in line)
    assert header.split()[:4] == ["┃", "move", "┃", "when"]  # the number --undo takes


def test_a_rollback_names_the_forced_promotion_it_returns_to(three_versions):
    """Back to a version that was forced there: not re-gated either, and the line says it came by force, and why."""
    with Ledger(three_versions) as ledger:
        promote(ledger, decide(ledger, "gpt", 3, "production"), why="hotfix", force=True)
        promote(ledger, decide(ledger, "gpt", 2, "production"))
        promote(ledger, decide(ledger, "gpt", 1, "staging"))
    back = run_cli("model", "rollback", "gpt", "--alias", "production")
    assert back.stdout == ("gpt@production: version 2 -> version 3 (rollback; not re-gated: version 3 was forced "
                           "there by move 1 (hotfix))\n")


def test_of_two_promotions_decided_at_once_one_wins_and_the_other_changes_nothing(three_versions):
    with Ledger(three_versions) as ledger:
        promote(ledger, decide(ledger, "gpt", 1, "production"))
        a, b = decide(ledger, "gpt", 2, "production"), decide(ledger, "gpt", 2, "staging")
        c = decide(ledger, "gpt", 2, "production")
        promote(ledger, a)
        promote(ledger, b)  # another alias: independent
        with pytest.raises(RegistryError, match=r"gpt@production moved from version 1 to version 2 \(promote by "):
            promote(ledger, c)
        assert [m["to_version"] for m in history(ledger, "gpt", "production")] == [1, 2]


def test_a_threshold_refuses_what_is_not_good_enough_even_with_nothing_to_beat(isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        job = job_with_checkpoints(ledger, tmp_path, "run", (5,))
        evaluated(ledger, job, 5, 1.8)
        register(ledger, "gpt", job, gate=Gate("heldout", "eval/loss", "min", threshold=1.7))
        decision = decide(ledger, "gpt", 1, "production")
        assert decision.refusal == ("gpt:1 has eval/loss 1.8, the gate's threshold is 1.7 "
                                    "(heldout eval/loss (lower is better, <= 1.7))")
        with pytest.raises(RegistryError, match="not promoted"):
            promote(ledger, decision)
        assert ledger.registry.alias("gpt", "production") is None and history(ledger, "gpt") == []


@pytest.mark.parametrize("args, message", [
    (["promote", "gpt", "9", "--alias", "production"], "gpt:9: model gpt has versions 1 to 3"),
    (["promote", "nope", "1", "--alias", "production"], "model 'nope': not registered"),
    (["promote", "gpt", "1", "--alias", "Production"], "alias 'Production'"),
    (["promote", "gpt", "1", "--alias", "latest"], "alias 'latest'"),
    (["rollback", "gpt", "--alias", "production"], "gpt@production: nothing to roll back"),
    (["rollback", "gpt", "--alias", "production", "--undo", "1"], "gpt@production: move 1 is none of its promotions"),
    (["history", "nope"], "model 'nope': not registered"),
])
def test_bad_moves_are_one_line_and_change_nothing(three_versions, args, message):
    out = run_cli("model", *args)
    assert out.returncode == 2 and out.stderr.startswith("hpctrain: error: ") and message in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1
    with Ledger(three_versions) as ledger:
        assert history(ledger, "gpt") == [] and ledger.registry.aliases("gpt") == []


@pytest.mark.parametrize("args", [("ls",), ("show", "gpt@production"), ("promote", "gpt", "2", "--alias", "staging"),
                                  ("history", "gpt")])
def test_the_registry_commands_import_neither_torch_nor_mlflow(three_versions, args):
    """They run on login nodes: the base install's click, pydantic and SQLite."""
    assert run_cli("model", "promote", "gpt", "1", "--alias", "production").returncode == 0
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "hpctrain", "model", *args], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & {"torch", "mlflow", "numpy", "pandas", "tensorstore"}  # pandas: see hpctrain.ledger.sqlite
