"""Parsers for Slurm's text output (kept apart so they can be tested on recorded output)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w/:.\-]*)=")


def parse_kv_line(line: str) -> dict[str, str]:
    """One `scontrol -o show ...` record: 'Key=Value Key2=Value with spaces' -> dict.

    The first occurrence of a key wins: from 26.05 a job's ``SubmitLine=`` holds the user's command
    line, whose own 'Key=...' words must not override Slurm's fields (they cut SubmitLine short there).
    """
    record: dict[str, str] = {}
    matches = list(_KEY.finditer(line))
    for m, nxt in zip(matches, matches[1:] + [None]):
        end = nxt.start() if nxt else len(line)
        record.setdefault(m.group(1), line[m.end() : end].strip())
    return record


def parse_kv_lines(text: str) -> list[dict[str, str]]:
    return [parse_kv_line(ln) for ln in text.splitlines() if ln.strip()]


def parse_parsable(text: str, fields: Iterable[str]) -> list[dict[str, str]]:
    """`-n -P` output (no header, '|'-separated) with the requested field names as keys."""
    names = [f.strip().lower() for f in fields]
    rows = []
    for line in text.splitlines():
        if line.strip():
            values = line.split("|")
            rows.append(dict(zip(names, values + [""] * (len(names) - len(values)))))
    return rows


def parse_parsable_with_header(text: str) -> list[dict[str, str]]:
    """`--parsable2` output whose first line names the columns: look columns up by name, never position."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return []
    header = [h.strip() for h in lines[0].split("|")]
    return [{k: v.strip() for k, v in zip(header, ln.split("|"))} for ln in lines[1:]]


_GRES_GPU = re.compile(r"(?:^|,)gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")


def gpus_in_gres(gres: str) -> int:
    """'gpu:4', 'gpu:h100:8(S:0-1)', 'gpu:a100:2,gpu:v100:2' -> total GPU count."""
    return sum(int(m.group(2)) for m in _GRES_GPU.finditer(gres or ""))
