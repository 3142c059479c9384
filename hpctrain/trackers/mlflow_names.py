"""Names MLflow takes: a metric, parameter or tag key may hold only letters, digits and ``_-. :/``, must not change
when read as a path (``a//b``, ``../a``, ``/a``) and is at most 250 characters. Any other name (a user's metric or
setting) is mapped to one it takes, unique by a digest of the original, which the run keeps in a tag of its own."""

from __future__ import annotations

import hashlib
import posixpath
import re

KEY_MAX = 250  # characters (MLflow's limit for every key)
TAG_VALUE_MAX = 8000  # characters (MLflow's limit)
ORIGINAL_TAG = "hpctrain.name."  # + the mapped name: the original name
_VALID = re.compile(r"[/\w.\- :]*")
_INVALID = re.compile(r"[^/\w.\- :]")
_MAPPED_MAX = KEY_MAX - len(ORIGINAL_TAG) - 9  # room for the tag's prefix and "-" + an 8-digit digest


def taken(name: str) -> bool:
    """Whether MLflow takes ``name`` as it is."""
    norm = posixpath.normpath(name)
    return (
        0 < len(name) <= KEY_MAX
        and _VALID.fullmatch(name) is not None
        and norm == name
        and norm != "."
        and not norm.startswith(("..", "/"))
    )


def valid(name: str) -> str:
    """``name``, or where MLflow would refuse it a name it takes: refused characters as ``_``, the path parts that
    would resolve away dropped, cut short, and ``-`` + a digest of the original."""
    if taken(name):
        return name
    parts = [p for p in _INVALID.sub("_", name).split("/") if p not in ("", ".", "..")]
    stem = "/".join(parts).lstrip("./")[:_MAPPED_MAX].rstrip("/.")
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{stem}-{digest}" if stem else digest


def originals(names: dict[str, str]) -> dict[str, str]:
    """The tags recording each original name of ``names`` (mapped name -> original) that was mapped."""
    return {f"{ORIGINAL_TAG}{m}": original[:TAG_VALUE_MAX] for m, original in names.items() if m != original}
