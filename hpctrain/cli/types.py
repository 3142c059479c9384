"""The click types of every numeric and id argument, bounded: an id or count past SQLite's integers (2**63) or below
its least, a NaN or an infinity, is refused as one usage error line before any work."""

from __future__ import annotations

import math
from typing import Any

import click

MAX_INT = 2**63 - 1  # the largest integer the ledger (SQLite) holds


def whole(minimum: int = 0, maximum: int = MAX_INT) -> click.IntRange:
    """A whole number from ``minimum`` to ``maximum`` (at most MAX_INT): a count, a step, a rank."""
    return click.IntRange(minimum, min(maximum, MAX_INT))


LEDGER_ID = whole(1)  # a ledger job id, a model version
INDEX = whole(0)  # an array task, a step, an attempt, a rank


class Finite(click.FloatRange):
    """A finite number from ``minimum`` to ``maximum`` (either open: None): never NaN or an infinity."""

    name = "finite number"

    def __init__(self, minimum: float | None = None, maximum: float | None = None, **kwargs: Any):
        super().__init__(minimum, maximum, **kwargs)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class Counts(click.ParamType):
    """Node counts, comma-separated ("4,2"), each a whole number of at least 1; "" for none."""

    name = "counts"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        parts = [p.strip() for p in str(value).split(",")] if str(value).strip() else []
        if not all(p.isdigit() and 1 <= int(p) <= MAX_INT for p in parts):
            self.fail(f"{value!r}: expected whole numbers of at least 1, comma-separated (4,2)", param, ctx)
        return tuple(int(p) for p in parts)
