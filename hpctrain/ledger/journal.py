"""The compute-node side of the ledger: atomic JSON records on the shared filesystem.

Compute nodes never open the SQLite ledger (SQLite over Lustre/NFS from many nodes corrupts
or deadlocks). They append records here instead, each one file written to a temporary name,
fsynced and renamed, so a reader sees whole records or nothing. `ingest_journal` on the login
node folds them into the ledger exactly once.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hpctrain.contract import JobEnvironment
from hpctrain.files import write_json_atomic

_seq = itertools.count()


def job_context(env: JobEnvironment | None = None) -> dict[str, Any]:
    """Who writes: the ledger job id (exported by the sbatch script) and the Slurm ids of this task."""
    env = env or JobEnvironment()
    return {
        "job_id": env.job_id,
        "slurm_job_id": env.slurm_job_id,
        "task_index": env.task_index,
        "restart": env.restart_count,
        "attempt": env.run_number if env.in_slurm else None,
        "step_restart": env.step_restarts,
        "host": env.node,
        "rank": env.rank,
    }


class Journal:
    """A directory of records; one per job (``<site paths.logs>/journal/<ledger job id>``)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)

    @classmethod
    def from_env(cls) -> Journal | None:
        """The job's journal when running under hpctrain's sbatch script, else None."""
        path = JobEnvironment().journal_dir
        return cls(path) if path else None

    def write(self, kind: str, **payload: Any) -> Path:
        """Append one record of ``kind`` (checkpoint, metrics, event, ...); returns its file."""
        self.dir.mkdir(parents=True, exist_ok=True)
        ctx = job_context()
        name = f"{time.time_ns():020d}-{ctx['host']}-{os.getpid()}-{next(_seq)}-{kind}.json"
        path = self.dir / name
        write_json_atomic(path, {"kind": kind, "time": time.time(), **ctx, **payload})
        return path

    def write_once(self, kind: str, **payload: Any) -> Path | None:
        """Append a record of ``kind`` unless one was written by this run on this node (the node's ranks and their
        loader workers alike): decided by an exclusive marker made first; None when another process had it."""
        ctx = job_context()
        mark = self.dir / "once" / f"{kind}.{ctx['task_index']}.{ctx['attempt']}.{ctx['host']}"
        mark.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            return None
        return self.write(kind, **payload)

    def names(self, kinds: Iterable[str] | None = None) -> list[str]:
        """Record file names in write order, only of ``kinds`` if given (told by the name, nothing is read)."""
        if not self.dir.is_dir():
            return []
        suffixes = tuple(f"-{k}.json" for k in kinds) if kinds is not None else (".json",)
        return sorted(p.name for p in self.dir.glob("[0-9]*.json") if p.name.endswith(suffixes))

    def read(self, name: str) -> dict[str, Any]:
        """One record; an unreadable file becomes a record of kind 'unreadable'."""
        path = self.dir / name
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            return {"kind": "unreadable", "file": str(path), "error": str(exc)}

    def records(self, kinds: Iterable[str] | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
        """(file name, record) in write order, only of ``kinds`` if given."""
        for name in self.names(kinds):
            yield name, self.read(name)
