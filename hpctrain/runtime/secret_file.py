"""The secrets file of a ledger job: write, path, read back, remove.

Values exported to sbatch stay in slurmctld's state for the job's life and, where a site sets
``AccountingStoreFlags=job_env``, in slurmdbd for good. So a job's secret env values travel in a
file of its job directory instead: created at submit, readable by the submitting user only, sourced
by the batch script before its step (every run, requeued ones included), removed once the job will
not run again.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any

from hpctrain.contract import JobPaths
from hpctrain.slurm.states import NO_MORE_RUNS


def names(spec: dict[str, Any]) -> list[str]:
    """The secret entries of a spec as JSON data (the ledger's spec_json, the job's spec.json)."""
    return [name for name, entry in (spec.get("env") or {}).items() if entry.get("secret")]


def path(job_dir: Path | str, job_id: int | str) -> Path:
    """One file per ledger job: the chunks of a large array share a job directory but end apart."""
    return JobPaths(Path(job_dir)).secrets_file(job_id)


def write(job_dir: Path | str, job_id: int | str, values: dict[str, str]) -> Path | None:
    """Create the file, mode 0600 from its first byte, as ``export NAME='value'`` lines (shell-quoted;
    names are validated and NUL is refused by the spec). None when there is nothing to write."""
    if not values:
        return None
    target = path(job_dir, job_id)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("".join(f"export {name}={shlex.quote(value)}\n" for name, value in values.items()))
    return target


def read(job_dir: Path | str, job_id: int | str) -> dict[str, str] | None:
    """The values in the file; None when it is gone."""
    try:
        text = path(job_dir, job_id).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    words = shlex.split(text)
    return dict(w.partition("=")[::2] for w in words if w != "export")


def remove(job_dir: Path | str | None, job_id: int | str) -> bool:
    """Delete the file; whether there was one."""
    if not job_dir:
        return False
    try:
        path(job_dir, job_id).unlink()
        return True
    except FileNotFoundError:
        return False


def remove_when_final(job_dir: Path | str | None, job_id: int | str, state: str) -> bool:
    """Delete the file when ``state`` (the job's, from the ledger) is one after which it runs no more."""
    return state in NO_MORE_RUNS and remove(job_dir, job_id)
