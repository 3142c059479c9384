"""How commands print what users and the ledger hold (names, reasons, paths): in rich output always as literal text,
never read as markup or emoji codes, with control characters (C0 but newline and tab, DEL, C1: terminal escapes)
shown as ``\\x1b``; and --json output as strict JSON (a non-finite number is null, never ``NaN``/``Infinity``).
Imports only the standard library at module load."""

from __future__ import annotations

import json
import math
import os
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: object) -> str:
    """``text`` as a string whose control characters (C0 but newline and tab, DEL, C1) read as ``\\xNN``: printed,
    it cannot move the cursor, retitle the window, hide text or make a link."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", str(text))


def make_console(min_width: int = 0) -> Console:
    """A rich console that prints every string literally (see ``visible``), styled only through ``style=`` and
    ``styled``; at least ``min_width`` columns, and 160 when output is not a terminal (unless $COLUMNS says), so piped
    tables are not squeezed to 80 columns."""
    from rich.console import Console

    class Literal(Console):
        # Every string rich prints passes here, table cells, headers and titles too.
        def render_str(self, text: str, **kwargs: Any) -> Text:
            return super().render_str(visible(text), **kwargs)

    console = Literal(markup=False, emoji=False)
    width = max(console.width if console.is_terminal or os.environ.get("COLUMNS") else 160, min_width)
    return console if width == console.width else Literal(markup=False, emoji=False, width=width)


def styled(*parts: str | tuple[str, str]) -> Text:
    """``parts`` (each a string, or a string and its rich style, such as "bold red") as one text, shown literally."""
    from rich.text import Text

    return Text.assemble(*(visible(p) if isinstance(p, str) else (visible(p[0]), p[1]) for p in parts))


def finite(value: Any) -> Any:
    """``value`` with every non-finite float in it (in dicts, lists and tuples) made None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def json_text(value: Any, **kwargs: Any) -> str:
    """``value`` as strict JSON (RFC 8259): non-finite numbers as null; what every --json prints."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
