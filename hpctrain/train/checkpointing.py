"""The reference trainer's checkpoints: engine state as hpctrain.checkpoint Shards, resume, periodic saves (at the
steps hpctrain.train.saves chooses)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from hpctrain.checkpoint import Checkpointer, Restored, Retention, Shard, restore_rng_state
from hpctrain.checkpoint.memory import KEEP_LAST as MEMORY_KEEP_LAST
from hpctrain.checkpoint.memory import load_agreed, memory_dir, remove_earlier_runs, remove_this_run
from hpctrain.checkpoint.naming import list_dirs, task_dir
from hpctrain.config.job import JobSpec
from hpctrain.config.site import Alerts, CheckpointConfig, job_site
from hpctrain.contract import JobEnvironment, JobPaths
from hpctrain.data.state import LoaderState
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.attempts import interruption_history
from hpctrain.train.engine import StepResult
from hpctrain.train.evaluation import EvalSchedule
from hpctrain.train.saves import SaveSchedule, earlier_measurements
from hpctrain.train.state import load_local_state, local_state, placements


def engine_tree(engine: Any) -> dict[str, Shard]:
    """This rank's slice of every global tensor (collective over the data-parallel group)."""
    state, where = local_state(engine), placements(engine)
    return {k: Shard(t, where[k].global_shape, where[k].offset, write=where[k].writer) for k, t in state.items()}


def layout_words(layout: dict[str, Any]) -> str:
    return " ".join(f"{k}={layout[k]}" for k in ("dp", "tp", "pp") if k in layout) or "an unrecorded layout"


def site_checkpoints() -> tuple[CheckpointConfig, Alerts, frozenset[str] | None]:
    """The checkpoint settings, the alert limits and the preemptible QOS of the job's site config (see job_site),
    else the defaults and None."""
    site = job_site()
    if site is None:
        return CheckpointConfig(), Alerts(), None
    return site.checkpoint, site.alerts, frozenset(name for name, q in site.qos.items() if q.preemptible)


def preempted_by_qos(spec: JobSpec, preemptible_qos: frozenset[str] | None, env: JobEnvironment) -> bool:
    """Whether preemptions may interrupt the job: by the QOS Slurm runs it in, where the site marks QOS (a spec whose
    `resources.preemptible` is "allowed" runs in either kind), else by the spec."""
    if env.qos is not None and preemptible_qos is not None:
        return env.qos in preemptible_qos
    return spec.resources.preemptible is not False


class TrainCheckpoints:
    """Saves at the steps of its `SaveSchedule` (async by default) and, with ``memory_every_steps``, to the
    node-local memory tier in between; resumes from the newest valid checkpoint of either tier."""

    def __init__(
        self, spec: JobSpec, engine: Any, directory: Path, loader: Any = None, evaluation: EvalSchedule | None = None
    ):
        p, c = spec.parallel, spec.checkpoint
        self.spec, self.engine, self.loader, self.evaluation = spec, engine, loader, evaluation
        self.site, self.alerts, self.preemptible_qos = site_checkpoints()
        site = self.site
        layout = {"dp": p.dp, "tp": p.tp, "pp": p.pp}
        self.ck = Checkpointer(
            directory,
            rank=engine.global_rank,
            world_size=engine.world_size,
            layout=layout,
            retention=Retention(keep_last=c.keep_last, keep_best=c.keep_best, metric=c.best_metric, mode=c.best_mode),
            mode=site.mode,
        )
        self.memory: Checkpointer | None = None
        if spec.checkpoint.memory_every_steps:
            env = JobEnvironment()
            local = int(os.environ.get("LOCAL_RANK", 0))
            if local == 0:
                remove_earlier_runs(site.memory_dir, env)
            dist.barrier()  # no rank writes its node's directory before that
            self.memory = Checkpointer(
                task_dir(memory_dir(site.memory_dir, env), env.task_index),
                rank=local,
                world_size=int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                layout=layout,
                writes_replicated=True,
                retention=Retention(keep_last=MEMORY_KEEP_LAST),
                journal=None,
                mode=site.mode,
            )
        self.last_step: int | None = None
        self.tier: str | None = None  # the one resumed from
        self.schedule = self.save_schedule(engine.global_rank)
        self.memory_schedule = self.save_schedule(engine.global_rank, memory=True) if self.memory else None
        if evaluation is not None:
            evaluation.checkpoint_due = self.schedule.due

    def save_schedule(self, rank: int, memory: bool = False) -> SaveSchedule:
        """The file-system tier's schedule, or the ``memory`` tier's; "auto" learns from the interruptions that lost
        work of jobs like this one in the ledger when it was submitted, and of this task so far (its journal), on
        the site's prior: for the memory tier, only the job steps restarted in place, on the prior for failures."""
        policy, env, journal = self.spec.checkpoint, JobEnvironment(), Journal.from_env()
        events, seconds = (
            interruption_history(journal, env.task_index, in_place_only=memory) if journal is not None else (0, 0.0)
        )
        if env.job_dir is not None and (alike := JobPaths(env.job_dir).interruptions_file).is_file():
            ledger = json.loads(alike.read_text())
            events, seconds = events + ledger["in_place" if memory else "events"], seconds + ledger["exposure_s"]
        measured = earlier_measurements(journal, env.task_index, memory) if journal is not None else None
        return SaveSchedule(
            policy,
            (events, seconds),
            self.site.prior_mtbi_s(preempted_by_qos(self.spec, self.preemptible_qos, env) and not memory),
            journal if rank == 0 else None,
            self.alerts.slow_save_factor,
            memory=memory,
            max_interval_s=self.site.max_interval_minutes * 60,
            measured=measured,
        )

    def resume(self) -> int:
        """Restore model, optimizer, RNG and data cursor from the newest valid checkpoint; the step to go on from."""
        tree = engine_tree(self.engine)
        restored = self.resume_from_memory(tree)
        if restored is None:
            restored = self.ck.load_latest(like=tree)
            self.tier = "file system" if restored else None
        for schedule in self.schedules():
            schedule.begin(restored.step if restored else 0)
        if restored is None:
            return 0
        load_local_state(self.engine, {k: s.data for k, s in tree.items()})
        if restored.rng:
            restore_rng_state(restored.rng)
        if self.loader is not None:
            self.resume_loader(restored)
        return restored.step

    def resume_loader(self, restored: Restored) -> None:
        """Exactly, from the cursor of whichever rank read what this rank's loader reads (a checkpoint of
        another tp or pp degree saved it under another rank); else at the same fraction of the epoch (another
        dp size, worker count or batch), which global rank 0 says in one line."""
        saved = [
            c["data"]
            for c in (restored.cursor, *(r.get("cursor") for r in restored.manifest.ranks.values()))
            if c and "data" in c
        ]
        if not saved:
            return
        exact = self.loader.exact_state(saved)
        self.loader.load_state_dict(exact or saved[0], approximate=exact is None)
        if exact is None and self.engine.global_rank == 0:
            before = LoaderState.from_dict(saved[0])
            print(
                f"hpctrain.train: checkpoint step {restored.step} was written with "
                f"{layout_words(restored.manifest.data.get('layout', {}))} and the data loader's "
                f"dp_size={before.dp_size} workers={before.workers} batch={before.batch_size}; this run has "
                f"{layout_words(self.ck.layout)} and dp_size={self.loader.dp_size} workers={self.loader.workers} "
                f"batch={self.loader.batch_size}: the data order goes on at the same fraction of epoch "
                f"{before.epoch}, not exactly (some samples may repeat or be missed)",
                file=sys.stderr,
                flush=True,
            )

    def resume_from_memory(self, tree: dict[str, Shard]) -> Restored | None:
        """The memory tier's newest checkpoint when it is newer than the file system's (a collective)."""
        if self.memory is None:
            return None
        durable = list_dirs(self.ck.directory)
        restored = load_agreed(
            self.memory.directory,
            self.memory_tree(tree),
            rank=self.memory.rank,
            newer_than=durable[-1].step if durable else -1,
        )
        if restored is not None:
            self.tier = "memory"
            if durable:  # the lineage goes on from the durable checkpoint before it
                self.ck.lineage["parent"] = durable[-1].path.name
        return restored

    def memory_tree(self, tree: dict[str, Shard]) -> dict[str, Any]:
        """The memory tier keeps each rank's own tensors, not global ones: no rank leaves its part to a
        data-parallel peer, which may be on another node."""
        assert self.memory is not None
        return {f"rank{self.memory.rank}": {k: s.data for k, s in tree.items()}}

    def save(self, step: int, loss: float, async_: bool, memory: bool = False) -> None:
        """Save ``step`` to the parallel file system, or to the memory tier; the manifest records the training
        loss and the step's evaluation, where the loop evaluated it."""
        cursor = {"data": self.loader.state_dict()} if self.loader is not None else None
        tree = engine_tree(self.engine)
        tier = self.memory if memory else self.ck
        assert tier is not None
        # local_state's tensors are fresh copies that nothing else changes: written without another copy
        begun = time.monotonic()
        future = tier.save(
            step,
            self.memory_tree(tree) if memory else tree,
            cursor=cursor,
            metrics={"loss": loss, **(self.evaluation.at(step) if self.evaluation else {})},
            async_=async_,
            copy="none",
        )
        if not memory:
            self.last_step = step
        schedule = self.memory_schedule if memory else self.schedule
        assert schedule is not None
        schedule.saved(step, time.monotonic() - begun, future)

    def finish(self, step: int, loss: float) -> None:
        """Make ``step`` durable now: complete the save in flight when it is this step's, else save synchronously."""
        if self.last_step != step:
            self.save(step, loss, async_=False)
        self.close()

    def schedules(self) -> list[SaveSchedule]:
        return [self.schedule] + ([self.memory_schedule] if self.memory_schedule else [])

    def hook(self, engine: Any, result: StepResult) -> None:
        async_ = self.spec.checkpoint.async_save
        for schedule in self.schedules():
            schedule.step_done(result.step_time_s)
        if self.schedule.due(result.step):
            self.save(result.step, result.loss, async_)
        elif self.memory_schedule is not None and self.memory_schedule.due(result.step):
            self.save(result.step, result.loss, async_, memory=True)
        for schedule in self.schedules():
            schedule.choose(result.step)

    def close(self) -> None:
        """Wait for the saves in flight; the run is over: free this node's memory tier."""
        try:
            self.ck.close()
        finally:
            if self.memory is not None:
                self.memory.close()
                dist.barrier()  # every local rank is done with its node's directory
                if self.memory.rank == 0:
                    remove_this_run(self.site.memory_dir)
