"""What a job is made of, recorded at submit time: code, data, parameters, versions.

Enough to tell whether two jobs ran the same thing, and to run one again (`hpctrain rerun`). Read
on the login node without importing torch: versions come from package metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from importlib.machinery import PathFinder
from pathlib import Path
from typing import Any

from hpctrain.config.job import JobSpec

PACKAGES = ("hpctrain", "torch", "deepspeed", "tensorstore", "webdataset")
_INTERPRETER = re.compile(r"^(python[\d.]*|bash|sh|env)$")
# Keys that differ between two runs of the same thing.
VOLATILE = ("rerun_of",)


def entry_point(command: list[str], cwd: Path) -> Path | None:
    """The file a job's command runs: the module of ``-m``, none for ``-c`` code, else its first argument
    that is a file (the interpreter itself aside)."""
    for i, arg in enumerate(command):
        if arg == "-c":
            return None
        if arg == "-m" and i + 1 < len(command):
            return module_file(command[i + 1], cwd)
        if _INTERPRETER.match(Path(arg).name):
            continue
        path = Path(arg) if Path(arg).is_absolute() else cwd / arg
        if _is_file(path):
            return path.resolve()
    return None


def module_file(name: str, cwd: Path) -> Path | None:
    """The file `python -m NAME` runs from ``cwd`` (a package's ``__main__``), found on the path that Python would
    search there without importing anything: a package's ``__init__`` is user code, and this runs at submit."""
    search = [str(cwd), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)), *sys.path[1:]]
    parts = name.split(".")
    try:
        # The top package on the path, else through another finder (an editable install's, say).
        spec = PathFinder.find_spec(parts[0], search) or next(
            (
                found
                for f in sys.meta_path
                if f is not PathFinder and hasattr(f, "find_spec")
                if (found := f.find_spec(parts[0], None)) is not None
            ),
            None,
        )
        for depth in range(1, len(parts)):  # each submodule inside the package before it, if that is one
            if spec is None or spec.submodule_search_locations is None:
                return None
            spec = PathFinder.find_spec(".".join(parts[: depth + 1]), list(spec.submodule_search_locations))
        if spec is not None and spec.submodule_search_locations is not None:
            return module_file(f"{name}.__main__", cwd)
    except (ImportError, ValueError):
        return None
    return Path(spec.origin) if spec is not None and spec.origin and _is_file(Path(spec.origin)) else None


def _is_file(path: Path) -> bool:
    """Path.is_file, false also for a name longer than the file system allows."""
    try:
        return path.is_file()
    except OSError:
        return False


def _git(directory: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(directory), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def code_state(path: Path | None) -> dict[str, Any]:
    """The entry point's repository: commit, and whether (and how) its files differ from it: tracked files changed,
    or files git does not ignore that it does not track (a new training script is one)."""
    if path is None:
        return {"entry_point": None}
    top = _git(path.parent, "rev-parse", "--show-toplevel")
    if top is None:
        return {"entry_point": str(path), "repo": None, "file_sha256": _sha256(path.read_bytes())}
    repo = Path(top.strip())
    diff = (_git(repo, "diff", "HEAD") or "").encode()
    untracked = sorted(filter(None, (_git(repo, "ls-files", "-z", "--others", "--exclude-standard") or "").split("\0")))
    changes = diff + b"".join(f"\0untracked {name}\0{_file_sha256(repo / name)}".encode() for name in untracked)
    return {
        "entry_point": str(path),
        "repo": str(repo),
        "commit": (_git(repo, "rev-parse", "HEAD") or "").strip(),
        "dirty": bool(changes),
        "diff_sha256": _sha256(changes) if changes else None,
    }


def _file_sha256(path: Path) -> str:
    """The file's SHA-256, read in chunks (an untracked file may be large); a link's is that of where it points, as
    git keeps it; "unreadable" where it cannot be read."""
    digest = hashlib.sha256()
    try:
        if path.is_symlink():
            return _sha256(os.readlink(path).encode())
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return "unreadable"
    return digest.hexdigest()


def data_snapshot(spec: JobSpec) -> dict[str, Any] | None:
    """The shard index (it lists every shard with its checksum): its path and hash."""
    index = spec.data.index
    if index is None:
        return None
    try:
        return {"index": str(index), "sha256": _sha256(Path(index).read_bytes())}
    except OSError as exc:
        return {"index": str(index), "error": exc.strerror}


def versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def lineage(spec: JobSpec, cwd: Path | None = None, **extra: Any) -> dict[str, Any]:
    """Everything recorded for a job at submit time (``extra``: e.g. rerun_of)."""
    cwd = (spec.workdir or cwd or Path.cwd()).resolve()
    return {
        "code": code_state(entry_point(spec.command, cwd)),
        "data": data_snapshot(spec),
        "hyperparameters": spec.hyperparameters,
        "seed": spec.seed,
        "parallel": spec.parallel.model_dump(mode="json"),
        "versions": versions(),
        "spec_sha256": _sha256(json.dumps(spec.redacted(), sort_keys=True).encode()),
        "cwd": str(cwd),
        **extra,
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """'key.path: old -> new' for every leaf that differs (volatile keys aside)."""
    flat_a, flat_b = flatten(a), flatten(b)
    return [
        f"{k}: {flat_a.get(k)!r} -> {flat_b.get(k)!r}"
        for k in sorted(flat_a.keys() | flat_b.keys())
        if k.split(".")[0] not in VOLATILE and flat_a.get(k) != flat_b.get(k)
    ]


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{'code': {'commit': 'ab'}} -> {'code.commit': 'ab'}."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for k, v in data.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
