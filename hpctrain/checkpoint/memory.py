"""The host-memory tier: frequent checkpoints to node-local memory, for restarts inside the allocation.

Each node keeps its own ranks' part of the state under ``<base>/hpctrain-<Slurm job id>.<run>/<node>``
(``base``: the site's ``checkpoint.memory_dir``, /dev/shm by default), written and committed by the
node's ranks alone as a checkpoint of the usual format (manifest, checksums, atomic commit), its ranks
numbered by their local rank, each writing all of its own tensors (a data-parallel replica may be on
another node). It survives a rank's crash, not the node's or the allocation's: a
requeued run starts from the parallel file system, and removes what an earlier run of the job left on
its node. Resuming, every rank must find the same step on its node: ``load_agreed`` settles on the
newest step that every node has committed and every rank loads.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.reader import load
from hpctrain.checkpoint.resume import Restored, statuses
from hpctrain.contract import JobEnvironment
from hpctrain.errors import CheckpointError
from hpctrain.parallel.collective import all_reduce_int

log = logging.getLogger("hpctrain.checkpoint")

KEEP_LAST = 2  # nodes commit a step one after another: the one before is what they all still have


def run_prefix(env: JobEnvironment) -> str:
    return f"hpctrain-{env.slurm_job_id or 'local'}."


def memory_dir(base: Path, env: JobEnvironment | None = None) -> Path:
    """This node's memory-tier directory for this run of the job (array tasks: see naming.task_dir)."""
    env = env or JobEnvironment()
    return base / f"{run_prefix(env)}{env.run_number}" / env.node


def remove_earlier_runs(base: Path, env: JobEnvironment | None = None) -> None:
    """Free the memory that earlier runs of this job left on this node (their checkpoints are not resumed)."""
    env = env or JobEnvironment()
    current = f"{run_prefix(env)}{env.run_number}"
    for old in base.glob(f"{run_prefix(env)}*"):
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)


def remove_this_run(base: Path, env: JobEnvironment | None = None) -> None:
    """Free this node's memory tier once the run is over (trained to the end, or stopped for a requeue)."""
    node = memory_dir(base, env)
    shutil.rmtree(node, ignore_errors=True)
    with contextlib.suppress(OSError):  # other nodes' directories may still be there (one shared /dev/shm)
        node.parent.rmdir()


def load_agreed(directory: Path, like: Any, *, rank: int, newer_than: int = -1) -> Restored | None:
    """The newest checkpoint past step ``newer_than`` in every rank's ``directory`` (its node's) that loads
    on every rank; None when there is none. A collective: every rank calls it."""
    found = {s.dir.step: s for s in statuses(directory) if s.manifest and s.dir.step > newer_than}
    bound = max(found, default=-1)
    while True:
        step = all_reduce_int(max((s for s in found if s <= bound), default=-1), "min")
        if step < 0:
            return None
        restored = None
        if step in found:
            status = found[step]
            assert status.manifest is not None  # found holds only statuses with one
            try:
                state = load(status.dir.path, like, rank=rank)
                saved = status.manifest.ranks.get(rank, {})
                restored = Restored(
                    status.dir.path, step, state, saved.get("cursor"), saved.get("rng"), status.manifest
                )
            except CheckpointError as exc:
                log.warning("memory-tier checkpoint not usable: %s", exc)
        if all_reduce_int(int(restored is not None), "min"):
            return restored
        bound = step - 1
