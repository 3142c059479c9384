"""Shared by the benchmarks: each headline figure as one machine-readable line, for `benchmarks/run_all`.

    figure("hpctrain --help", 0.05, "s", goal="< 0.5 s", met=True)
prints  FIGURE {"name": ..., "value": ..., "unit": ..., "goal": ..., "met": ...}
"""

from __future__ import annotations

import json

PREFIX = "FIGURE "


def figure(name: str, value: float, unit: str, goal: str = "", met: bool | None = None) -> None:
    print(PREFIX + json.dumps({"name": name, "value": value, "unit": unit, "goal": goal, "met": met}), flush=True)
