"""The sweep spec: a job, a search space, a search method, a metric to optimise and an early-stopping rule."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from hpctrain.config.job import JOB_NAME
from hpctrain.config.loading import Loc, StrictModel, load_model


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("expected a number")
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


def _scalar(value: Any) -> Any:
    if not isinstance(value, (str, int, float, bool)):
        raise ValueError("expected a string, number or boolean")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("expected a finite number (a trial's parameters travel as JSON)")
    return value


def _job_ref(value: Any) -> Any:
    if not isinstance(value, (str, dict)):
        raise ValueError("expected a path to a job spec file or an inline job table")
    return value


# Checked before pydantic's union validation, so a bad value gives one error rather than one per member.
Number = Annotated[int | float, BeforeValidator(_number)]
Scalar = Annotated[str | int | float | bool, BeforeValidator(_scalar)]
JobRef = Annotated[str | dict[str, Any], BeforeValidator(_job_ref)]

_KEYS_FOR = {
    "values": ("choice",),
    "low": ("uniform", "loguniform", "int"),
    "high": ("uniform", "loguniform", "int"),
    "log": ("int",),
    "step": ("int",),
}


class Param(StrictModel):
    """One searched hyperparameter: a choice among values, or a float or integer range."""

    type: Literal["choice", "uniform", "loguniform", "int"]
    values: list[Scalar] | None = Field(None, description="choice: the candidates")
    low: Number | None = Field(None, description="uniform, loguniform, int: lower bound, inclusive")
    high: Number | None = Field(None, description="uniform, loguniform, int: upper bound (inclusive for int)")
    log: bool | None = Field(None, description="int: sample on a log scale")
    step: int | None = Field(None, ge=1, description="int: spacing of the values from low (default 1)")

    def problems(self) -> Iterator[tuple[Loc, str]]:
        """Cross-key problems, located relative to this parameter."""
        for key, types in _KEYS_FOR.items():
            if getattr(self, key) is not None and self.type not in types:
                yield (key,), f"not used by type {self.type!r} (only by {', '.join(map(repr, types))})"
        if self.type == "choice":
            yield from self._choice_problems()
        else:
            yield from self._range_problems()

    def _choice_problems(self) -> Iterator[tuple[Loc, str]]:
        if not self.values:
            yield (), "type 'choice' needs a non-empty list of values"
            return
        for i, value in enumerate(self.values):
            if value in self.values[:i]:
                yield ("values", i), f"duplicate value {value!r}"

    def _range_problems(self) -> Iterator[tuple[Loc, str]]:
        low, high = self.low, self.high
        if low is None or high is None:
            missing = [key for key in ("low", "high") if getattr(self, key) is None]
            yield (), f"type {self.type!r} needs {' and '.join(missing)}"
            return
        if self.type != "int":
            if not low < high:
                yield (), f"low must be < high, got low = {low}, high = {high}"
            elif self.type == "loguniform" and low <= 0:
                yield ("low",), f"low must be > 0 for type 'loguniform', got {low}"
            return
        if not (isinstance(low, int) and isinstance(high, int)):
            yield (), f"type 'int' needs integer low and high, got low = {low}, high = {high}"
        elif low > high:
            yield (), f"low must be <= high, got low = {low}, high = {high}"
        elif self.log and low < 1:
            yield ("low",), f"low must be >= 1 with log = true, got {low}"
        elif self.log and (self.step or 1) > 1:
            yield ("step",), "step cannot be combined with log = true"
        elif (high - low) % (self.step or 1):
            yield ("high",), f"high - low = {high - low} must be a multiple of step = {self.step}"

    def grid_values(self) -> Sequence[Any] | None:
        """Every value a grid visits, in order; None for continuous ranges."""
        if self.type == "choice":
            return self.values
        if self.type == "int" and self.low is not None and self.high is not None:
            return range(int(self.low), int(self.high) + 1, self.step or 1)
        return None


class EarlyStopping(StrictModel):
    """Stop running trials whose intermediate metric lags behind the others'."""

    rule: Literal["median", "halving"]
    metric: str | None = Field(None, description="default: the sweep's metric")
    grace_steps: int = Field(0, ge=0, description="no decision before this step")
    min_trials: int = Field(3, ge=1, description="no decision with fewer other trials at the step (or rung)")
    reduction_factor: int = Field(3, ge=2, description="halving: keep the best 1/reduction_factor at each rung")
    min_resource: int = Field(1, ge=1, description="halving: the step of the first rung")

    def problems(self) -> Iterator[tuple[Loc, str]]:
        if self.rule != "halving":
            for key in ("reduction_factor", "min_resource"):
                if key in self.model_fields_set:
                    yield (key,), "only for rule 'halving'"


class SweepSpec(StrictModel):
    name: str = Field(pattern=JOB_NAME)
    job: JobRef = Field(description="a job spec file (kept as written), or an inline job table")
    method: Literal["grid", "random", "bayes"]
    search: dict[str, Param]
    metric: str = Field(min_length=1)
    direction: Literal["minimize", "maximize"]
    max_trials: int | None = Field(None, ge=1, description="default for grid: the grid's size")
    max_parallel: int = Field(1, ge=1)
    max_failures: int = Field(2, ge=0, description="failures of one trial that are retried before it counts as failed")
    seed: int = 0
    startup_trials: int = Field(10, ge=0, description="bayes: random trials before TPE models the results")
    early_stopping: EarlyStopping | None = None

    @model_validator(mode="after")
    def _defaults(self) -> SweepSpec:
        if self.early_stopping is not None and self.early_stopping.metric is None:
            self.early_stopping.metric = self.metric
        if self.method == "grid" and self.max_trials is None:
            self.max_trials = self.grid_size() or None
        return self

    def grid_size(self) -> int:
        """The number of grid points; 0 when a parameter has no finite set of values."""
        size = 1
        for param in self.search.values():
            values = param.grid_values()
            size *= len(values) if values is not None else 0
        return size

    def problems(self) -> Iterator[tuple[Loc, str]]:
        bad_search = not self.search
        if bad_search:
            yield ("search",), "expected at least one parameter"
        for name, param in self.search.items():
            for loc, msg in param.problems():
                bad_search = True
                yield ("search", name, *loc), msg
        if self.early_stopping is not None:
            for loc, msg in self.early_stopping.problems():
                yield ("early_stopping", *loc), msg
        if "startup_trials" in self.model_fields_set and self.method != "bayes":
            yield ("startup_trials",), "only for method 'bayes'"
        if self.method != "grid":
            if self.max_trials is None:
                yield ("max_trials",), f"missing required key for method {self.method!r}"
        elif not bad_search:
            yield from self._grid_problems()

    def _grid_problems(self) -> Iterator[tuple[Loc, str]]:
        continuous = False
        for name, param in self.search.items():
            if param.grid_values() is None:
                continuous = True
                yield ("search", name), f"method 'grid' needs type 'choice' or 'int', got {param.type!r}"
        size = self.grid_size()
        if not continuous and self.max_trials is not None and self.max_trials > size:
            yield ("max_trials",), f"max_trials = {self.max_trials} exceeds the grid's {size} points"


def load_sweep_spec(path: str | os.PathLike[str]) -> SweepSpec:
    return load_model(SweepSpec, Path(path))
