"""The report page: one HTML file from the Jinja2 template page.html.j2, plots embedded as PNG data URIs."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpctrain import __version__


@dataclass
class Plot:
    title: str  # also the image's alt text
    png: bytes | None  # None: nothing to plot, the page says so
    note: str = ""

    @property
    def src(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png or b"").decode()


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]] = field(default_factory=list)


def render(title: str, facts: list[tuple[str, Any]], plots: list[Plot], tables: list[Table]) -> str:
    """The page; every value is HTML-escaped."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True, undefined=jinja2.StrictUndefined
    )
    return env.get_template("page.html.j2").render(
        title=title,
        facts=facts,
        plots=plots,
        tables=tables,
        version=__version__,
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
