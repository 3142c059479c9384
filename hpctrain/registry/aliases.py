"""Aliases: a model's named pointers (production, staging, ...) at one version each, moved by a promotion that
passes the gate (or is forced, with a reason), and moved back by a rollback; every move is kept.

A move is decided on what its caller saw (the alias's target and newest move, both versions' results) and moves
the alias only if it is still as seen, newest move included (an alias moved away and back is not "as seen"): of
two moves of one alias decided at once, one wins and the other is refused, changing nothing.

A rollback is not re-gated: it returns the alias to the version it held before the move it undoes, which got there
through the gate or by a forced promotion with its reason; the rollback records which (``basis``) and says it.
Named by the move it undoes, a rollback run again finds the rollback done and changes nothing (``undo``).
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
    seen_move: int | None
    numbers: dict[str, Any]
    refusal: str | None


def decide(ledger: Ledger, model: str, version: int, alias: str) -> Decision:
    """Whether the gate lets ``model:version`` become ``alias``, with the numbers it compared."""
    check_alias(alias)
    gate = Gate.of_model(model_of(ledger, model))
    candidate = resolve(ledger, Ref(model, version=version))
    seen, seen_move = ledger.registry.seen(model, alias)
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
        refusal = f"{name} has no {gate.evaluator} result for {gate.metric} ({gate.how_to_evaluate(ledger, candidate)})"
    elif not gate.within_threshold(value):
        refusal = f"{name} has {gate.metric} {value:.6g}, the gate's threshold is {gate.threshold:g} ({gate})"
    elif against is not None and not gate.no_worse(value, against):
        refusal = f"{name} has {gate.metric} {value:.6g}, worse than {model}@{alias} ({model}:{seen}) at {against:.6g}"
    return Decision(model, alias, version, seen, seen_move, numbers, refusal)


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
    seen = (decision.seen, decision.seen_move)
    done = ledger.registry.move(decision.model, decision.alias, seen, decision.version, move)
    if done is None:
        _moved(ledger, decision.model, decision.alias, decision.seen)
    assert done is not None
    return done


def rollback(ledger: Ledger, model: str, alias: str, why: str | None = None) -> AliasMoveRow:
    """``undo``'s rollback of the newest promotion not yet rolled back."""
    return undo(ledger, model, alias, why)[0]


def undo(
    ledger: Ledger, model: str, alias: str, why: str | None = None, move: int | None = None
) -> tuple[AliasMoveRow, bool]:
    """Move ``alias`` back to where the newest promotion not yet rolled back took it from (no target: remove it):
    (the rollback, True). Given ``move`` (an id), that promotion must be the one, and if a rollback undid it
    already: (that rollback, False), nothing changed; so a rollback run again (killed after its commit, or twice
    at once) undoes its move once. Not re-gated: the rollback's ``gate_json`` keeps the gate's numbers now and its
    ``basis``, the promotion that took the alias to that version before."""
    check_alias(alias)
    gate = Gate.of_model(model_of(ledger, model))
    if move is not None:
        if not any(m["id"] == move and m["action"] != "rollback" for m in ledger.registry.moves(model, alias)):
            raise RegistryError(
                f"{model}@{alias}: move {move} is none of its promotions (see `hpctrain model history {model}`)"
            )
        found = _undoing(ledger, model, alias, move)
        if found is not None:
            return found, False
    with ledger.reading():  # one snapshot: a twin's rollback committed between two reads read as nothing to undo
        seen = ledger.registry.seen(model, alias)
        last = ledger.registry.last_move_standing(model, alias)
    if seen[0] is None or last is None or last["to_version"] != seen[0]:
        raise RegistryError(f"{model}@{alias}: nothing to roll back (see `hpctrain model history {model}`)")
    if move is not None and last["id"] != move:
        raise RegistryError(f"{model}@{alias}: move {move} is not the newest promotion standing (move {last['id']} is)")
    to = last["from_version"]
    numbers = {
        "gate": str(gate),
        "metric": gate.metric,
        "candidate": None if to is None else gate.result(ledger, resolve(ledger, Ref(model, version=to))),
        "current": gate.result(ledger, resolve(ledger, Ref(model, version=seen[0]))),
        "current_version": seen[0],
        "regated": False,
        "basis": _basis(ledger, model, alias, last),
    }
    row = {"action": "rollback", "by": getpass.getuser(), "why": why, "gate_json": numbers, "undoes": last["id"]}
    done = ledger.registry.move(model, alias, seen, to, row)
    if done is None:
        found = None if move is None else _undoing(ledger, model, alias, move)  # a twin was first
        if found is not None:
            return found, False
        _moved(ledger, model, alias, seen[0])
    assert done is not None
    return done, True


def _undoing(ledger: Ledger, model: str, alias: str, move: int) -> AliasMoveRow | None:
    """The rollback that undid ``move`` (None: none has)."""
    return next((m for m in ledger.registry.moves(model, alias) if m["undoes"] == move), None)


def _basis(ledger: Ledger, model: str, alias: str, undone: AliasMoveRow) -> str:
    """Why undoing ``undone`` needs no gate: the promotion (or forced one) that had taken the alias where it goes."""
    to = undone["from_version"]
    if to is None:
        return "the alias is removed"
    moves = {m["id"]: m for m in ledger.registry.moves(model, alias)}
    before = [i for i in moves if i < undone["id"]]
    while before:
        came = moves[max(before)]  # the alias's moves are one chain: this one took it to ``to``
        if came["action"] == "promote":
            return f"not re-gated: version {to} passed the gate when move {came['id']} promoted it"
        if came["action"] == "force":
            return f"not re-gated: version {to} was forced there by move {came['id']} ({came['why']})"
        undid = came["undoes"]  # a rollback: the alias held ``to`` before the move it undid
        before = [i for i in moves if undid is not None and i < undid]
    return f"version {to}: no move took the alias there"


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


def basis(move: AliasMoveRow) -> str | None:
    """Why a rollback needed no gate (None: not a rollback, or one recorded before rollbacks kept it)."""
    found = gate_numbers(move).get("basis")
    return found if isinstance(found, str) else None


def gate_numbers(move: AliasMoveRow) -> dict[str, Any]:
    return json.loads(move["gate_json"]) if move["gate_json"] else {}
