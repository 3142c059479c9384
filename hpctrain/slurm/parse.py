"""Parsers for Slurm's text output (kept apart so they can be tested on recorded output)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import overload

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
    return list(Parsable.of(text))


class Parsable(Sequence[dict[str, str]]):
    """`--parsable2` output whose first line names the columns, each line parsed into a row when it is read: a
    poll of thousands of jobs reads most of them only as the text that says nothing changed."""

    def __init__(self, header: list[str], lines: list[str]):
        self.header, self.lines = header, lines

    @classmethod
    def of(cls, text: str) -> Parsable:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return cls([h.strip() for h in lines[0].split("|")] if lines else [], lines[1:])

    def row(self, line: str) -> dict[str, str]:
        return {k: v.strip() for k, v in zip(self.header, line.split("|"))}

    def column(self, name: str) -> Iterable[tuple[str, str]]:
        """(the value of column ``name``, the line) for each line, without parsing the rest of it."""
        at = self.header.index(name)
        return ((line.split("|", at + 1)[at].strip(), line) for line in self.lines)

    @overload
    def __getitem__(self, index: int) -> dict[str, str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, str]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, str] | list[dict[str, str]]:
        if isinstance(index, slice):
            return [self.row(line) for line in self.lines[index]]
        return self.row(self.lines[index])

    def __len__(self) -> int:
        return len(self.lines)


_GRES_GPU = re.compile(r"(?:^|,)gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")


def gpus_in_gres(gres: str) -> int:
    """'gpu:4', 'gpu:h100:8(S:0-1)', 'gpu:a100:2,gpu:v100:2' -> total GPU count."""
    return sum(int(m.group(2)) for m in _GRES_GPU.finditer(gres or ""))


# The time as slurm_make_time_str writes it, ISO by default, with whatever follows it up to " using" (26.05.5 was
# seen to print "2026-12-03T17:33:37 a using ...").
_TEST_ONLY = re.compile(
    r"Job \d+ to start at (?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)[^\n]*? using \d+ processors on nodes "
    r"(?P<nodes>\S+) in partition (?P<partition>\S+)"
)


def parse_test_only(text: str) -> tuple[str, str, str] | None:
    """`sbatch --test-only`'s estimate ("sbatch: Job 7 to start at 2026-12-03T17:21:56 using 1 processors on nodes
    n3 in partition gpu", on stderr): (the start as Slurm prints it, local time; the nodes; the partition)."""
    m = _TEST_ONLY.search(text)
    return (m["at"], m["nodes"], m["partition"]) if m else None
