"""The reference trainer's checkpoints: engine state as hpctrain.checkpoint Shards, resume, periodic saves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpctrain.checkpoint import Checkpointer, Retention, Shard, restore_rng_state
from hpctrain.config.job import JobSpec
from hpctrain.config.site import CheckpointConfig, load_site
from hpctrain.contract import JobEnvironment
from hpctrain.train.engine import StepResult
from hpctrain.train.state import load_local_state, local_state, placements


def engine_tree(engine: Any) -> dict[str, Shard]:
    """This rank's slice of every global tensor (collective over the data-parallel group)."""
    state, where = local_state(engine), placements(engine)
    return {k: Shard(t, where[k].global_shape, where[k].offset, write=where[k].writer) for k, t in state.items()}


def checkpoint_mode() -> int:
    """Permissions of checkpoint metadata: those of the site config named by $HPCTRAIN_SITE (which hpctrain's
    sbatch script exports), else the default."""
    site = JobEnvironment().site
    return load_site(site).checkpoint.mode if site else CheckpointConfig().mode


class TrainCheckpoints:
    """Saves every ``checkpoint.every_steps`` steps (async by default) and resumes from the newest valid one."""

    def __init__(self, spec: JobSpec, engine: Any, directory: Path, loader: Any = None):
        p = spec.parallel
        self.spec, self.engine, self.loader = spec, engine, loader
        self.ck = Checkpointer(directory, rank=engine.global_rank, world_size=engine.world_size,
                               layout={"dp": p.dp, "tp": p.tp, "pp": p.pp},
                               retention=Retention(keep_last=spec.checkpoint.keep_last), mode=checkpoint_mode())
        self.last_step: int | None = None

    def resume(self) -> int:
        """Restore model, optimizer, RNG and data cursor from the newest valid checkpoint; the step to go on from."""
        tree = engine_tree(self.engine)
        restored = self.ck.load_latest(like=tree)
        if restored is None:
            return 0
        load_local_state(self.engine, {k: s.data for k, s in tree.items()})
        if restored.rng:
            restore_rng_state(restored.rng)
        if self.loader is not None and restored.cursor:
            self.loader.load_state_dict(restored.cursor["data"])
        return restored.step

    def save(self, step: int, loss: float, async_: bool) -> None:
        cursor = {"data": self.loader.state_dict()} if self.loader is not None else None
        # local_state's tensors are fresh copies that nothing else changes: written without another copy
        self.ck.save(step, engine_tree(self.engine), cursor=cursor, metrics={"loss": loss}, async_=async_,
                     copy="none")
        self.last_step = step

    def finish(self, step: int, loss: float) -> None:
        """Make ``step`` durable now: complete the save in flight when it is this step's, else save synchronously."""
        if self.last_step != step:
            self.save(step, loss, async_=False)
        self.close()

    def hook(self, engine: Any, result: StepResult) -> None:
        every = self.spec.checkpoint.every_steps
        if every and result.step % every == 0:
            self.save(result.step, result.loss, self.spec.checkpoint.async_save)

    def close(self) -> None:
        self.ck.close()
