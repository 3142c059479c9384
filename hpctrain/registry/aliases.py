"""Aliases: a model's named pointers (production, staging, ...) at one version each, moved by a promotion that
passes the gate (or is forced, with a reason), and moved back by a rollback; every move is kept.

A promotion is decided on what its caller saw (the alias's target and both versions' results) and moves the
alias only if it still points there: of two promotions of one alias decided at once, one wins and the other is
refused, changing nothing.
"""

from __future__ import annotations

import getpass
import json
from dataclasses import dataclass
from typing import Any

from hpctrain.ledger import Ledger
from hpctrain.ledger.rows import AliasMoveRow
from hpctrain.registry.gate import Gate
from hpctrain.registry.names import Ref, RegistryError, check_alias
from hpctrain.registry.versions import model_of, resolve


@dataclass(frozen=True)
class Decision:
    """A promotion of ``version`` to ``alias`` as decided on the alias's target ``seen`` and the gate's numbers;
    ``refusal`` says why the gate refuses it (None: it passes)."""

    model: str
    alias: str
    version: int
    seen: int | None
    numbers: dict[str, Any]
    refusal: str | None


def decide(ledger: Ledger, model: str, version: int, alias: str) -> Decision:
    """Whether the gate lets ``model:version`` become ``alias``, with the numbers it compared."""
    check_alias(alias)
    gate = Gate.of_model(model_of(ledger, model))
    candidate = resolve(ledger, Ref(model, version=version))
    current = ledger.registry.alias(model, alias)
    seen = current["version"] if current else None
    if seen == version:
        raise RegistryError(f"{model}@{alias} is version {version} already")
    value = gate.result(ledger, candidate)
    target = resolve(ledger, Ref(model, version=seen)) if seen is not None else None
    against = gate.result(ledger, target) if target is not None else None
    numbers = {
        "gate": str(gate),
        "metric": gate.metric,
        "candidate": value,
        "current": against,
        "current_version": seen,
    }
    name = f"{model}:{version}"
    refusal = None
    if value is None:
        refusal = (
            f"{name} has no {gate.evaluator} result for {gate.metric} (evaluate job {candidate['job_id']} step "
            f"{candidate['step']}: hpctrain eval {candidate['job_id']} --step {candidate['step']} --evaluator "
            f"{gate.evaluator})"
        )
    elif not gate.within_threshold(value):
        refusal = f"{name} has {gate.metric} {value:.6g}, the gate's threshold is {gate.threshold:g} ({gate})"
    elif against is not None and not gate.no_worse(value, against):
        refusal = f"{name} has {gate.metric} {value:.6g}, worse than {model}@{alias} ({model}:{seen}) at {against:.6g}"
    return Decision(model, alias, version, seen, numbers, refusal)


def promote(ledger: Ledger, decision: Decision, why: str | None = None, force: bool = False) -> AliasMoveRow:
    """Move the alias as ``decision`` decided: refused when the gate refused it (unless ``force``, which needs
    ``why``), and when the alias has moved since the decision."""
    if decision.refusal and not force:
        raise RegistryError(f"not promoted: {decision.refusal}")
    if force and not (why or "").strip():
        raise RegistryError("a forced promotion needs a reason (--why TEXT)")
    move = {
        "action": "force" if force else "promote",
        "by": getpass.getuser(),
        "why": why,
        "gate_json": {**decision.numbers, "refusal": decision.refusal},
        "undoes": None,
    }
    done = ledger.registry.move(decision.model, decision.alias, decision.seen, decision.version, move)
    if done is None:
        _moved(ledger, decision.model, decision.alias, decision.seen)
    assert done is not None
    return done


def rollback(ledger: Ledger, model: str, alias: str, why: str | None = None) -> AliasMoveRow:
    """Move ``alias`` back to where the newest promotion not yet rolled back took it from (no target: remove it)."""
    check_alias(alias)
    model_of(ledger, model)
    current = ledger.registry.alias(model, alias)
    last = ledger.registry.last_move_standing(model, alias)
    if current is None or last is None or last["to_version"] != current["version"]:
        raise RegistryError(f"{model}@{alias}: nothing to roll back (see `hpctrain model history {model}`)")
    move = {"action": "rollback", "by": getpass.getuser(), "why": why, "gate_json": None, "undoes": last["id"]}
    done = ledger.registry.move(model, alias, current["version"], last["from_version"], move)
    if done is None:
        _moved(ledger, model, alias, current["version"])
    assert done is not None
    return done


def _moved(ledger: Ledger, model: str, alias: str, seen: int | None) -> None:
    """Refuse a move whose alias moved after it was decided, naming the move that came first."""
    last = ledger.registry.moves(model, alias)[-1]
    raise RegistryError(
        f"{model}@{alias} moved from {_v(seen)} to {_v(last['to_version'])} ({last['action']} by {last['by']}) while "
        "this was decided; nothing changed: look again and retry"
    )


def _v(version: int | None) -> str:
    return "nowhere" if version is None else f"version {version}"


def history(ledger: Ledger, model: str, alias: str | None = None) -> list[AliasMoveRow]:
    """Every move of the model's aliases (of ``alias`` only), oldest first."""
    model_of(ledger, model)
    if alias is not None:
        check_alias(alias)
    return ledger.registry.moves(model, alias)


def gate_numbers(move: AliasMoveRow) -> dict[str, Any]:
    return json.loads(move["gate_json"]) if move["gate_json"] else {}
