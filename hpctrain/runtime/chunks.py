"""A throttle (``%T``) that holds across the chunks of an array split past MaxArraySize, without idling.

Each chunk is a Slurm array of its own with ``%T``, and each chunk after the first waits (afterany) for the
one before: that keeps the submission at T running tasks at most, but leaves slots idle while a chunk's
last tasks run. This module keeps the submission's table of chunks (the job directory's ``chunks.json``:
the submitter adds each chunk once sbatch took it) and, whenever a task ends for good (`hpctrain attempt
end`), lets the later chunks use the slots the earlier ones no longer need: chunk j may run T less the
tasks of the chunks before it that have not ended, set as its ArrayTaskThrottle. Its afterany on the whole
chunk before becomes an afterany on the tasks that have just said they end (their batch scripts are still
exiting: Slurm counts them as running until they have), so the sum never exceeds T. A task that ends
without telling (its batch script killed) keeps its slot until its chunk ends, as before.
"""

from __future__ import annotations

import json
import time
from bisect import bisect_right
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Protocol

from hpctrain.contract import JobPaths
from hpctrain.files import exclusive_lock, write_json_atomic

LOCK_TIMEOUT_S = 30.0
# A task that said it ends has left Slurm well within this; an older id may no longer be known to Slurm
# (MinJobAge), and a dependency on an unknown job is refused.
EXITING_S = 60.0


class Releaser(Protocol):
    def set_array_throttle(self, target: str, throttle: int, dependency: str | None = None) -> None: ...


@dataclass
class Chunk:
    slurm_id: str
    offset: int  # its task i runs parameter set offset + i
    count: int
    released: int  # the throttle Slurm holds for it now; 0 while it waits for the chunk before

    def holds(self, param_index: int) -> bool:
        return self.offset <= param_index < self.offset + self.count


@dataclass
class ChunkTable:
    throttle: int
    singleton: bool  # the spec's dependency.singleton: a released chunk keeps it
    chunks: list[Chunk] = field(default_factory=list)
    ended: set[int] = field(default_factory=set)  # parameter indices of the tasks that ended for good
    exiting: dict[str, float] = field(default_factory=dict)  # Slurm ids of tasks that said they end -> when

    def dependency(self, chunk: Chunk) -> str:
        """What a released chunk waits for: the tasks of other chunks still exiting (and the singleton)."""
        exiting = [k for k in self.exiting if k.partition("_")[0] != chunk.slurm_id]
        return ",".join(
            ([f"afterany:{':'.join(exiting)}"] if exiting else []) + (["singleton"] if self.singleton else [])
        )

    def left(self) -> list[int]:
        """Each chunk's tasks not yet ended."""
        left, starts = [c.count for c in self.chunks], [c.offset for c in self.chunks]
        for i in self.ended:
            j = bisect_right(starts, i) - 1
            if j >= 0 and self.chunks[j].holds(i):
                left[j] -= 1
        return left

    def allowances(self, left: list[int]) -> list[int]:
        """Each chunk's throttle now: T less the tasks of the chunks before it that have not ended (``left``)."""
        out, waiting = [], 0
        for n in left:
            out.append(max(0, self.throttle - waiting))
            waiting += n
        return out

    def release(self, slurm: Releaser) -> None:
        """Raise each later chunk's throttle to its allowance, or to its tasks left if fewer (Slurm calls only
        where that grew)."""
        left = self.left()
        for chunk, allowed, n in zip(self.chunks, self.allowances(left), left):
            wanted = min(allowed, n)
            if wanted > chunk.released:
                slurm.set_array_throttle(chunk.slurm_id, wanted, self.dependency(chunk))
                chunk.released = wanted


def start_table(paths: JobPaths, throttle: int, singleton: bool) -> None:
    """An empty table, made before the first sbatch: a task that ends before its chunk is added still counts."""
    _save(paths, ChunkTable(throttle, singleton))


def add_chunk(paths: JobPaths, chunk: Chunk, slurm: Releaser) -> None:
    """Record a chunk sbatch took (the first with its full throttle, later ones waiting), and release it at
    once if the tasks before it have already left it room."""
    with _locked(paths) as table:
        table.chunks.append(chunk)
        table.release(slurm)


def task_ended(paths: JobPaths, param_index: int, slurm_id: str, slurm: Releaser) -> None:
    """Count the task of parameter set ``param_index`` (Slurm id ``slurm_id``, exiting now) as ended for good,
    and release the room it leaves. Nothing for a submission without a table (not chunked, or not throttled)."""
    if not paths.chunks_file.exists():
        return
    with _locked(paths) as table:
        now = time.time()
        table.ended.add(param_index)
        table.exiting = {k: t for k, t in table.exiting.items() if t > now - EXITING_S} | {slurm_id: now}
        table.release(slurm)


@contextmanager
def _locked(paths: JobPaths) -> Iterator[ChunkTable]:
    """The table, under the job directory's lock, saved afterwards even when a Slurm call failed midway (the
    tasks counted must stay counted)."""
    with exclusive_lock(paths.chunks_lock, LOCK_TIMEOUT_S):
        data = json.loads(paths.chunks_file.read_text(encoding="utf-8"))
        table = ChunkTable(
            data["throttle"],
            data["singleton"],
            [Chunk(**c) for c in data["chunks"]],
            set(data["ended"]),
            data["exiting"],
        )
        try:
            yield table
        finally:
            _save(paths, table)


def _save(paths: JobPaths, table: ChunkTable) -> None:
    write_json_atomic(paths.chunks_file, asdict(table) | {"ended": sorted(table.ended)}, sync_dir=False)
