"""Suggest the parameters of a sweep's next trials: grid, random, or Bayesian (Optuna's TPE).

Suggestions are deterministic. Grid and random trial k depend only on (spec.seed, k); Bayesian
trial k on spec.seed, k and the history it is suggested from.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeGuard

from hpctrain.sweep.spec import Param, SweepSpec

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.samplers import TPESampler
    from optuna.trial import FrozenTrial

State = Literal["pending", "running", "completed", "failed", "pruned"]

# TPE sees at most this many trials of a long history (see _tpe_window); each of its calls is
# linear in the trials it sees, and older trials weigh little in its model anyway.
TPE_WINDOW = 1000
_VALIDATED = "a validated spec: a choice parameter has values, a range low and high"


@dataclass(slots=True)
class TrialRecord:
    """A trial the sweep knows of; ``intermediate`` is the early-stopping metric by step."""

    number: int
    params: dict[str, Any]
    state: State
    value: float | None = None
    intermediate: dict[int, float] = field(default_factory=dict)


def suggest(spec: SweepSpec, history: list[TrialRecord], n: int) -> list[dict[str, Any]]:
    """Parameters for up to ``n`` new trials, numbered from len(history), within spec.max_trials.

    ``history`` holds trials 0 .. len(history)-1 in any state.
    """
    start = len(history)
    n = min(n, (spec.max_trials or 0) - start)
    if n <= 0:
        return []
    numbers = range(start, start + n)
    if spec.method == "grid":
        return [grid_point(spec, k) for k in numbers]
    if spec.method == "random":
        return [random_point(spec, k) for k in numbers]
    return _tpe_points(spec, history, numbers)


def grid_point(spec: SweepSpec, k: int) -> dict[str, Any]:
    """The k-th point of the grid, in itertools.product order over spec.search (last key fastest)."""
    point: dict[str, Any] = {}
    for name, param in reversed(spec.search.items()):
        values = param.grid_values()
        assert values is not None, "a validated grid spec has only choice and int parameters"
        k, i = divmod(k, len(values))
        point[name] = values[i]
    return {name: point[name] for name in spec.search}


def random_point(spec: SweepSpec, k: int) -> dict[str, Any]:
    """Trial k's independent random sample."""
    rng = random.Random(derive_seed(spec.seed, k))
    return {name: _sample(param, rng) for name, param in spec.search.items()}


def derive_seed(seed: int, k: int) -> int:
    """A 32-bit seed for trial k (stable across processes, unlike hash())."""
    digest = hashlib.blake2b(f"hpctrain-sweep:{seed}:{k}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


def _sample(param: Param, rng: random.Random) -> Any:
    if param.type == "choice":
        assert param.values is not None, _VALIDATED
        return rng.choice(param.values)
    low, high = param.low, param.high
    assert low is not None and high is not None, _VALIDATED
    if param.type == "uniform":
        return rng.uniform(low, high)
    if param.type == "loguniform":
        return math.exp(rng.uniform(math.log(low), math.log(high)))
    if param.log:
        # floor of a log-uniform draw on [low, high + 1): P(v) proportional to log((v + 1) / v).
        return min(int(math.exp(rng.uniform(math.log(low), math.log(high + 1)))), int(high))
    values = param.grid_values()
    assert values is not None, _VALIDATED
    return rng.choice(values)


def _tpe_points(spec: SweepSpec, history: list[TrialRecord], numbers: range) -> list[dict[str, Any]]:
    """Ask TPE for each new trial in turn, on an in-memory study rebuilt from the history.

    Pending and running trials (and each new trial once asked) enter the study as RUNNING: with
    TPE's constant liar they count as bad results, which spreads out suggestions made in parallel.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {name: _distribution(param) for name, param in spec.search.items()}
    study = optuna.create_study(direction=spec.direction, sampler=_tpe(spec, numbers[0]))
    study.add_trials(_frozen_trials(_tpe_window(spec, history), dists))
    points = []
    for k in numbers:
        # Seeded per trial number, so asking for one trial or several in a batch agree on each.
        study.sampler = _tpe(spec, k)
        params = study.ask(dists).params
        points.append({name: params[name] for name in spec.search})
    return points


def _tpe(spec: SweepSpec, k: int) -> TPESampler:
    from optuna.samplers import TPESampler

    return TPESampler(seed=derive_seed(spec.seed, k), n_startup_trials=spec.startup_trials, constant_liar=True)


def _tpe_window(spec: SweepSpec, history: list[TrialRecord]) -> list[TrialRecord]:
    """The trials TPE sees: all of a short history; else the latest TPE_WINDOW plus the best 25 overall.

    TPE models the best trials (at most 25 of them, by its default gamma) against the rest, so
    keeping the best exactly and only the recent rest keeps its model of good regions intact.
    """
    if len(history) <= TPE_WINDOW:
        return history
    recent = history[-TPE_WINDOW:]
    sign = 1.0 if spec.direction == "minimize" else -1.0
    done = [(sign * t.value, t) for t in history[:-TPE_WINDOW] if t.state == "completed" and _finite(t.value)]
    best = [t for _, t in sorted(done, key=lambda scored: scored[0])[:25]]
    return sorted(best, key=lambda t: t.number) + recent


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def _frozen_trials(history: Iterable[TrialRecord], dists: dict[str, BaseDistribution]) -> list[FrozenTrial]:
    """Optuna trials for the history; failed trials, and trials outside the search space, are left out."""
    from optuna.trial import TrialState, create_trial

    out = []
    for t in history:
        kw: dict[str, Any]
        if t.state == "completed" and _finite(t.value):
            kw = {"state": TrialState.COMPLETE, "value": t.value}
        elif t.state == "pruned":
            last = max(t.intermediate, default=None)
            kw = {
                "state": TrialState.PRUNED,
                "intermediate_values": {} if last is None else {last: t.intermediate[last]},
            }
        elif t.state in ("pending", "running"):
            kw = {"state": TrialState.RUNNING}
        else:
            continue
        try:
            params = {name: t.params[name] for name in dists}
            out.append(create_trial(params=params, distributions=dists, **kw))
        except (KeyError, ValueError):  # the search space changed since this trial ran
            continue
    return out


def _distribution(param: Param) -> BaseDistribution:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if param.type == "choice":
        assert param.values is not None, _VALIDATED
        return CategoricalDistribution(param.values)
    assert param.low is not None and param.high is not None, _VALIDATED
    if param.type == "int":
        return IntDistribution(int(param.low), int(param.high), log=bool(param.log), step=param.step or 1)
    return FloatDistribution(param.low, param.high, log=param.type == "loguniform")


def importance(spec: SweepSpec, completed: list[TrialRecord]) -> dict[str, float]:
    """Each parameter's importance for the metric over completed trials (Optuna's default evaluator);
    {} while there is too little to tell."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    dists = {name: _distribution(param) for name, param in spec.search.items()}
    study = optuna.create_study(direction=spec.direction)
    study.add_trials(_frozen_trials(completed, dists))
    if len({t.value for t in study.trials}) < 2:
        return {}
    return dict(optuna.importance.get_param_importances(study))
