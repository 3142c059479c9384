"""Read TOML/JSON/YAML files into pydantic models; turn every validation problem into one line."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from pydantic_core import ErrorDetails

from hpctrain.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

M = TypeVar("M", bound=BaseModel)

Loc = tuple[str | int, ...]


class StrictModel(BaseModel):
    """Base for config sections: unknown keys are errors, not silently ignored; no string holds a NUL."""

    # strict: TOML and YAML carry types, so '2' for an integer or "yes" for a bool is a mistake.
    model_config = ConfigDict(extra="forbid", populate_by_name=True, strict=True, defer_build=True)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # Every string here may end in an argv, an environment, a path or a Slurm option: none can hold one.
        if _holds_nul(value):
            raise ValueError("a NUL byte (\\u0000) cannot be passed to a program, an environment or a path")
        return value


def _holds_nul(value: Any) -> bool:
    """Whether a string, or one in a list or among a dict's values, holds a NUL byte. Models check their own
    fields; keys are checked where they are named (environment names, say)."""
    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, (list, tuple)):
        return any(map(_holds_nul, value))
    if isinstance(value, dict):
        return any(map(_holds_nul, value.values()))
    return False


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a TOML (.toml), JSON (.json) or YAML (.yaml/.yml) file into a dict."""
    try:
        text = _read_regular(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (undecodable byte at offset {exc.start})") from None
    kind = {".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}.get(path.suffix, "TOML")
    try:
        data = _parse(kind, text)
    except RecursionError:
        raise ConfigError(f"{path}: invalid {kind}: nested too deeply") from None
    except _YamlError as exc:
        raise ConfigError(f"{path}: invalid YAML{exc}") from None
    except ValueError as exc:  # also TOML and JSON integers past Python's 4300-digit limit
        raise ConfigError(f"{path}: invalid {kind}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a table of keys at the top level, got {type(data).__name__}")
    return data


def _read_regular(path: Path) -> str:
    """The text of ``path`` if it is a regular file: a FIFO would block until written to, a device never end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once, without waiting for a writer
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ConfigError(f"{path}: not a regular file")
    except BaseException:
        os.close(fd)
        raise
    with open(fd, encoding="utf-8") as file:
        return file.read()


class _YamlError(Exception):
    """A YAML file's error: where (if known) and what, as the error line ends."""


def _parse(kind: str, text: str) -> Any:
    if kind == "JSON":
        return json.loads(text)
    if kind == "TOML":
        return tomllib.loads(text)
    import yaml  # only for a YAML file: 10 ms of every command's start otherwise

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise _YamlError(f"{where}: {getattr(exc, 'problem', exc)}") from None
    try:
        json.dumps(data, default=str, skipkeys=True)
    except ValueError:  # an anchor used inside itself: validation and the ledger would recurse forever
        raise ValueError("an alias refers to the node that contains it") from None
    return {} if data is None else data


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def format_loc(loc: Loc) -> str:
    """('partitions', 'gpu', 'nodes', 0) -> 'partitions.gpu.nodes[0]'; other keys are quoted as in TOML."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            continue
        # Quoted (escaped where unprintable, so one problem stays one line) unless a bare key.
        key = part if _BARE_KEY.fullmatch(part) else json.dumps(part, ensure_ascii=not part.isprintable())
        out += f".{key}" if out else key
    return out or "(top level)"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_EXPECTED = {
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "tuple_type": "expected a list",
    "finite_number": "expected a finite number",
}


def describe_error(err: ErrorDetails) -> str:
    """One pydantic error -> 'what was expected, got what'."""
    kind = err["type"]
    if kind == "missing":
        return "missing required key"
    if kind == "extra_forbidden":
        return "unknown key"
    got = f", got {_show(err.get('input'))}"
    if kind in _EXPECTED:
        return _EXPECTED[kind] + got
    ctx = err.get("ctx") or {}
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        limit = next(iter(ctx.values()), "?")
        return f"expected a number {op} {limit}{got}"
    if kind == "too_short":
        return f"expected at least {ctx.get('min_length', 1)} item(s){got}"
    if kind == "literal_error":
        return f"expected one of {ctx.get('expected', '?')}{got}"
    if kind == "string_pattern_mismatch":
        return f"expected a string matching {ctx.get('pattern')}{got}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"])) + got
    msg = err["msg"]
    return msg[0].lower() + msg[1:] + got


def format_problems(path: Path | str, problems: Iterable[tuple[Loc, str]]) -> str:
    """Lines of '<file>: <key.path>: <message>'."""
    return "\n".join(f"{path}: {format_loc(loc)}: {msg}" for loc, msg in problems)


def validate(model: type[M], data: dict[str, Any], path: Path | str, prefix: Loc = ()) -> M:
    """Validate ``data`` (found at key ``prefix`` of the file) as ``model``; raise ConfigError with one line per problem."""
    try:
        obj = model.model_validate(data)
    except ValidationError as exc:
        problems = [(prefix + tuple(e["loc"]), describe_error(e)) for e in exc.errors(include_url=False)]
        raise ConfigError(format_problems(path, problems)) from None
    cross = getattr(obj, "problems", None)
    found = [(prefix + loc, msg) for loc, msg in cross()] if cross else []
    if found:
        raise ConfigError(format_problems(path, found))
    return obj


def load_model(model: type[M], path: Path) -> M:
    """Read and validate one config file."""
    return validate(model, read_mapping(path), path)


_VAR = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")
# Variables that must not be expanded: the secrets of the job spec being validated. An expanded path is written
# into the batch script (kept by Slurm), spec.json and the ledger.
_SECRET_VARS: ContextVar[frozenset[str]] = ContextVar("hpctrain_secret_vars", default=frozenset())
# The names expanded inside an `expanded_variables` block (None outside one).
_EXPANDED_VARS: ContextVar[set[str] | None] = ContextVar("hpctrain_expanded_vars", default=None)
# Inside an `as_resolved` block: paths were expanded once already (a recorded spec), and are taken as they are.
_RESOLVED: ContextVar[bool] = ContextVar("hpctrain_paths_resolved", default=False)


@contextmanager
def secret_variables(names: Iterable[str]) -> Iterator[None]:
    """While validating inside this block, a path naming one of ``names`` is refused instead of expanded."""
    token = _SECRET_VARS.set(frozenset(names))
    try:
        yield
    finally:
        _SECRET_VARS.reset(token)


@contextmanager
def as_resolved() -> Iterator[None]:
    """While validating inside this block, paths are taken as written, never expanded (again): a literal '$' or
    '~' that a recorded path holds stays."""
    token = _RESOLVED.set(True)
    try:
        yield
    finally:
        _RESOLVED.reset(token)


@contextmanager
def expanded_variables() -> Iterator[set[str]]:
    """The names of the variables expanded (or left to their defaults) while validating inside this block: what a
    config read elsewhere (a cron job) needs from this environment to mean the same."""
    names: set[str] = set()
    token = _EXPANDED_VARS.set(names)
    try:
        yield names
    finally:
        _EXPANDED_VARS.reset(token)


def expand_vars(text: str) -> str:
    """Expand $VAR, ${VAR} and ${VAR:-default}; unknown variables without a default stay as written."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(3)
        if name in _SECRET_VARS.get():
            raise ValueError(
                f"${name} is a secret (env.{name}): a path is written into the batch script, spec.json "
                "and the ledger, so it cannot hold one"
            )
        if (expanded := _EXPANDED_VARS.get()) is not None:
            expanded.add(name)
        value = os.environ.get(name)
        if value:
            return value
        return m.group(2) if m.group(2) is not None else m.group(0)

    return _VAR.sub(sub, text)


def expand_path(value: Any) -> Path:
    """Expand ~ and environment variables in a path string."""
    text = str(value) if isinstance(value, (str, os.PathLike)) else ""
    if not text or "\0" in text:
        raise ValueError("expected a path")
    if _RESOLVED.get():
        return Path(text)
    expanded = Path(expand_vars(text))
    try:
        return expanded.expanduser()
    except RuntimeError:  # "~name" of no user: Path's "Could not determine home directory"
        raise ValueError(f"{expanded.parts[0]}: no user of that name has a home directory") from None
