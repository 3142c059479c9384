"""`scontrol show assoc_mgr`: slurmctld's own view of every limit and what is in use against it, in one call;
`Limit`, one of them as hpctrain shows and checks it.

Each association and QOS record lists its limits as ``Name=LIMIT(USED)`` (``N`` for no limit) and TRES
limits as ``Name=tres=LIMIT(USED),...``; per-job limits have no usage (``MaxWallPJ=60``,
``MaxTRESPJ=gres/gpu=2``). A QOS's per-user usage is under "User Limits", by uid (``0``; ``root(0)``
from 24.11 on).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

GPU = "gres/gpu"
_VALUE = re.compile(r"^(?P<limit>[^()]*)\((?P<used>[^()]*)\)$")


@dataclass(frozen=True)
class Usage:
    """One limit: its value (None: no limit) and what is in use or spent against it (None: not shown)."""

    limit: float | None
    used: float | None


@dataclass
class Record:
    """One association (account, user; user "" for the account itself) or one QOS (``name``)."""

    name: str = ""
    account: str = ""
    user: str = ""
    parent: str = ""
    values: dict[str, Usage] = field(default_factory=dict)  # "MaxJobs", "GrpTRES:gres/gpu", ...
    users: dict[str, dict[str, Usage]] = field(default_factory=dict)  # a QOS's per-user usage, by uid (and name)


def _number(text: str) -> float | None:
    text = text.strip()
    if text in ("", "N"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _usage(text: str) -> Usage:
    m = _VALUE.match(text)
    return Usage(_number(m["limit"]), _number(m["used"])) if m else Usage(_number(text), None)


def _put(values: dict[str, Usage], key: str, value: str) -> None:
    if "=" in value:  # a TRES list: cpu=N(0),gres/gpu=4(2)
        for item in value.split(","):
            tres, _, v = item.partition("=")
            values[f"{key}:{tres}"] = _usage(v)
    elif value:
        values[key] = _usage(value)


def _strip_id(text: str) -> str:
    """``root(0)`` -> ``root``."""
    return text.split("(", 1)[0]


def parse(text: str) -> tuple[list[Record], list[Record]]:
    """(association records, QOS records) of `scontrol show assoc_mgr flags=assoc,qos` output."""
    assocs: list[Record] = []
    qos: list[Record] = []
    current: Record | None = None
    section = ""  # within a QOS: "accounts" (skipped: per-account limits), "users"
    target: dict[str, Usage] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if line.startswith("ClusterName="):
            fields = dict(t.split("=", 1) for t in line.split() if "=" in t)
            current = Record(account=fields.get("Account", ""), user=_strip_id(fields.get("UserName", "")))
            assocs.append(current)
            section, target = "", current.values
        elif line.startswith("QOS="):
            current = Record(name=_strip_id(line[4:].strip()))
            qos.append(current)
            section, target = "", current.values
        elif current is None or not stripped or stripped in ("No Accounts", "No Users"):
            continue
        elif stripped in ("Account Limits", "User Limits"):
            section = "accounts" if stripped == "Account Limits" else "users"
        elif section == "accounts":
            continue
        elif section == "users" and "=" not in stripped:  # "0" before 24.11, "root(0)" since
            target = current.users.setdefault(_strip_id(stripped), {})
            if "(" in stripped:
                current.users[stripped.split("(", 1)[1].rstrip(")")] = target
        else:
            for token in stripped.split():
                key, _, value = token.partition("=")
                if key == "ParentAccount":
                    current.parent = _strip_id(value)
                else:
                    _put(target, key, value)
    return assocs, qos


@dataclass(frozen=True)
class Limit:
    """One limit on the user's jobs: where it is set (``scope``: "account teamb", "teamb/root", "QOS normal",
    "QOS normal per user"), what it limits, Slurm's name for it, its value and what is in use or spent."""

    scope: str
    what: str
    slurm_name: str
    limit: float
    used: float
    how: str
    covers: tuple[str, ...] = ()  # the user's accounts an association's limit holds for (all: a QOS's)

    @property
    def unit(self) -> str:
        if self.slurm_name == "MaxWallPJ":
            return "minutes"
        return ("GPU-minutes" if "Mins" in self.slurm_name else "GPUs") if "TRES" in self.slurm_name else "jobs"

    @property
    def left(self) -> float:
        return max(self.limit - self.used, 0)

    def account(self) -> str | None:
        return None if self.scope.startswith("QOS ") else self.scope.removeprefix("account ").split("/")[0]

    def qos(self) -> str | None:
        return self.scope.split()[1] if self.scope.startswith("QOS ") else None

    def applies(self, account: str | None, qos: str | None) -> bool:
        """Whether the limit holds for a job of ``account`` in ``qos``."""
        return (self.qos() or qos) == qos and (not self.covers or account in self.covers)

    def describe(self) -> str:
        """The cap and its use, for limits held while jobs run."""
        return f"{self.scope}'s {self.what} cap: {number(self.used)} of {number(self.limit)} in use"

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "left": self.left}


def number(x: float) -> str:
    """1.0 -> '1', 2.5 -> '2.5', 1e7 -> '10000000' (never an exponent)."""
    return f"{x:.0f}" if float(x).is_integer() or abs(x) >= 1e6 else f"{x:g}"
