"""Names in the registry: a model's name, an alias, and references to a version (NAME, NAME@ALIAS, NAME:VERSION)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpctrain.errors import HpctrainError

# Model names become file names (pins, export folders) and MLflow names: no '/', '@' or ':', no leading '-' or '.'.
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
ALIAS = re.compile(r"[a-z][a-z0-9_-]{0,63}")


class RegistryError(HpctrainError):
    """An unknown model, version or alias, a name that cannot be one, or a move the registry refuses."""


def check_model_name(name: str) -> str:
    if not MODEL_NAME.fullmatch(name):
        raise RegistryError(
            f"model name {name!r}: use 1-100 letters, digits, '_', '.' or '-', starting with a letter or digit"
        )
    return name


def check_alias(alias: str) -> str:
    if not ALIAS.fullmatch(alias) or alias == "latest":
        raise RegistryError(
            f"alias {alias!r}: use 1-64 lowercase letters, digits, '_' or '-', starting with a letter "
            "('latest' is the newest version's name already)"
        )
    return alias


@dataclass(frozen=True)
class Ref:
    """A reference to a model version: by number, by alias, or the newest (neither)."""

    model: str
    version: int | None = None
    alias: str | None = None

    def __str__(self) -> str:
        return self.model + (f":{self.version}" if self.version else f"@{self.alias}" if self.alias else "")


def parse_ref(text: str) -> Ref:
    """NAME (its newest version, as NAME@latest), NAME@ALIAS or NAME:VERSION."""
    match = re.fullmatch(r"([^@:]*)(?:([@:])(.*))?", text, re.DOTALL)
    assert match is not None  # the pattern matches any text
    name, sep, rest = match.groups()
    check_model_name(name)
    if sep == ":":
        if not re.fullmatch(r"[1-9][0-9]{0,17}", rest):
            raise RegistryError(f"{text!r}: a version is a number from 1 (NAME:VERSION)")
        return Ref(name, version=int(rest))
    if sep == "@" and rest != "latest":
        return Ref(name, alias=check_alias(rest))
    return Ref(name)
