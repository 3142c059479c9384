"""Field types shared by the site config and the job spec."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    FiniteFloat,
    PlainSerializer,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

from hpctrain.config.loading import expand_path
from hpctrain.config.shell import check_shell_command

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$", re.ASCII)
# Partition, QOS and account names go on #SBATCH lines: letters, digits and _.- only.
SLURM_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,254}"
SLURM_NAME_RULE = "expected a Slurm name: a letter or digit, then letters, digits, _ . or - (255 at most)"
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
MAX_ARG_STRLEN = 32 * 4096  # Linux: the most bytes one argument or environment entry may hold, its NUL included
_Arg = TypeVar("_Arg", str, Path)


def check_slurm_name(value: str) -> str:
    if not re.fullmatch(SLURM_NAME, value):
        raise ValueError(SLURM_NAME_RULE)
    return value


def check_bind_path(value: str) -> str:
    """A container mount 'src[:dst[:ro|rw]]' of absolute paths (pyxis and Apptainer both join them with commas)."""
    parts = value.split(":")
    if (
        not 1 <= len(parts) <= 3
        or not all(p.startswith("/") for p in parts[:2])
        or (len(parts) == 3 and parts[2] not in ("ro", "rw"))
        or re.search(r"[,\s]", value)
    ):
        raise ValueError("expected 'src[:dst[:ro|rw]]' with absolute paths and no commas or spaces")
    return value


def check_image(value: str) -> str:
    if not value or re.search(r"\s", value):
        raise ValueError("expected a container image: a path or an image reference, without spaces")
    return check_not_option(value)


def check_not_option(value: _Arg) -> _Arg:
    """A program, image or argument that another program reads: one starting with '-' would be read as an option
    (``./-name`` names such a file)."""
    if str(value).startswith("-"):
        raise ValueError(
            f"{str(value)!r} starts with '-', which the program it is given to reads as an option "
            "(write a file of that name as './-...')"
        )
    return value


def check_argument(value: str) -> str:
    """An argument a program is run with: UTF-8 text (the batch script is) no longer than one argument may be."""
    try:
        size = len(value.encode()) + 1
    except UnicodeEncodeError as exc:
        raise ValueError(f"not UTF-8 text: a lone surrogate at character {exc.start}") from None
    if size > MAX_ARG_STRLEN:
        raise ValueError(
            f"{size} bytes with its NUL, more than the {MAX_ARG_STRLEN} one argument may hold (Linux's "
            "MAX_ARG_STRLEN): the program would fail with 'Argument list too long'"
        )
    return value


def check_file_mode(value: int) -> int:
    if not 0 <= value <= 0o777:
        raise ValueError("expected permission bits from 0o000 to 0o777, such as 0o640")
    return value


def parse_slurm_time(value: Any) -> int:
    """Slurm time string (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) or minutes -> seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("expected a Slurm time such as '04:00:00' or '1-12:00:00'")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError("expected a positive number of minutes")
        return value * 60
    m = _TIME.match(value.strip())
    if not m:
        raise ValueError("expected a Slurm time such as '04:00:00' or '1-12:00:00'")
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    # The leading field is unbounded ('90' minutes, '48:00:00'); the ones after it count within it.
    if any(n >= 60 for n in nums[1:]) or (days is not None and nums[0] >= 24):
        raise ValueError("expected a Slurm time with minutes and seconds below 60 (and hours below 24 after 'D-')")
    if days is not None:  # D-HH[:MM[:SS]]
        h, mi, s = (nums + [0, 0])[:3]
        total = int(days) * 86400 + h * 3600 + mi * 60 + s
    elif len(nums) == 1:  # MM
        total = nums[0] * 60
    elif len(nums) == 2:  # MM:SS
        total = nums[0] * 60 + nums[1]
    else:  # HH:MM:SS
        total = nums[0] * 3600 + nums[1] * 60 + nums[2]
    if total <= 0:
        raise ValueError("expected a positive duration")
    return total


def format_slurm_time(seconds: int) -> str:
    """Seconds -> D-HH:MM:SS (or HH:MM:SS under a day), the form sbatch --time takes."""
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    hms = f"{h:02d}:{m:02d}:{s:02d}"
    return f"{days}-{hms}" if days else hms


_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE | re.ASCII)
_MEM_FACTOR = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_memory(value: Any) -> int:
    """'16G', '512M', '1T' or an integer number of MiB -> MiB."""
    if isinstance(value, bool):
        raise ValueError("expected a memory size such as '16G'")
    if isinstance(value, int):
        mb = value
    elif isinstance(value, str) and (m := _MEM.match(value.strip())):
        mb = int(int(m.group(1)) * _MEM_FACTOR[m.group(2).upper()])
    else:
        raise ValueError("expected a memory size such as '16G' or '512M'")
    if mb <= 0:
        raise ValueError("expected a positive memory size")
    return mb


# Serialised back in the forms they are written in, so a dumped spec validates to the same spec.
Seconds = Annotated[int, BeforeValidator(parse_slurm_time), PlainSerializer(format_slurm_time, return_type=str)]
MiB = Annotated[int, BeforeValidator(parse_memory), PlainSerializer(lambda mb: f"{mb}M", return_type=str)]
ExpandedPath = Annotated[Path, BeforeValidator(expand_path)]
SlurmName = Annotated[str, AfterValidator(check_slurm_name)]
FileMode = Annotated[int, AfterValidator(check_file_mode)]  # TOML: 0o640
BindPath = Annotated[str, AfterValidator(check_bind_path)]
ImageRef = Annotated[str, AfterValidator(check_image)]
ShellCommand = Annotated[str, AfterValidator(check_shell_command)]  # a setup line of the batch script
Argument = Annotated[str, AfterValidator(check_argument)]  # one item of a command's argv
Program = Annotated[str, AfterValidator(check_not_option)]  # a command name or path, run by srun, exec or apptainer
ProgramPath = Annotated[Path, BeforeValidator(expand_path), AfterValidator(check_not_option)]


def _one_error(expected: str) -> WrapValidator:
    """A union's failure as one error naming what it takes (pydantic reports each member's)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError("auto_or", expected) from None

    return WrapValidator(check)


# A checkpoint interval: a positive number, or "auto" (hpctrain.checkpoint.interval); in minutes at most 30 days (one
# of centuries overflows the step count it is turned into).
MAX_EVERY_MINUTES = 30 * 24 * 60
StepsOrAuto = Annotated[
    Annotated[int, Field(ge=1)] | Literal["auto"], _one_error('expected a whole number of steps >= 1 or "auto"')
]
MinutesOrAuto = Annotated[
    Annotated[FiniteFloat, Field(gt=0, le=MAX_EVERY_MINUTES)] | Literal["auto"],
    _one_error(f'expected a number of minutes > 0 and <= {MAX_EVERY_MINUTES} (30 days) or "auto"'),
]
