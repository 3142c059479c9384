"""python -m hpctrain.train --spec SPEC --steps N: train the reference GPT on synthetic data.

Run once per rank (srun or torchrun set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK).
Rank 0 prints one JSON line per step on stdout: {"step", "loss", "step_time_s", "tokens_per_s"};
everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback
from typing import Any

from hpctrain.config.job import Model, load_job_spec
from hpctrain.contract import SPEC_ENV, JobEnvironment
from hpctrain.errors import HpctrainError
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.stragglers import ComputeTimer
from hpctrain.runtime.watchdog import RankWatchdog, hang_timeouts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.train", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=JobEnvironment().spec_file, help=f"job spec (default: ${SPEC_ENV})")
    parser.add_argument("--steps", type=int, required=True, help="train until this optimizer step (resumes count)")
    args = parser.parse_args(argv)
    if not args.spec:
        parser.error(f"give --spec or set {SPEC_ENV}")
    return args


def step_printer(tokens_per_step: int):
    """A step hook that prints the step's JSON line on global rank 0."""

    def hook(engine, result) -> None:
        if engine.global_rank == 0:
            print(
                json.dumps(
                    {
                        "step": result.step,
                        "loss": result.loss,
                        "step_time_s": result.step_time_s,
                        "tokens_per_s": tokens_per_step / result.step_time_s,
                    }
                ),
                flush=True,
            )

    return hook


def metrics_journal(tokens_per_step: int, loader: Any):
    """A step hook that journals the step's metrics (rank 0) for `hpctrain reconcile` to fold into the ledger."""
    journal = Journal.from_env()

    def hook(engine, result) -> None:
        if journal is None or engine.global_rank != 0:
            return
        values = {
            "loss": result.loss,
            "lr": engine.get_lr()[0],
            "step_time_s": result.step_time_s,
            "tokens_per_s": tokens_per_step / result.step_time_s,
            **gpu_metrics(),
        }
        if loader is not None:
            values.update(loader.stats.metrics())
        journal.write("metrics", step=result.step, values=values)

    return hook


def gpu_metrics() -> dict[str, float]:
    """Peak GPU memory (GiB) and utilisation (%) of this rank's device, where there is one."""
    import torch

    if not torch.cuda.is_available():
        return {}
    values = {"gpu_mem_gb": torch.cuda.max_memory_allocated() / 2**30}
    try:
        values["gpu_util_pct"] = float(torch.cuda.utilization())
    except (ModuleNotFoundError, RuntimeError):  # needs NVML (pynvml)
        pass
    return values


def preemption_guard(rank: int) -> Any:
    """Installed before the data loader forks its workers, so they inherit the handlers instead of dying;
    on ``rank`` 0 it asks Slurm for the job's state when a stop comes."""
    from hpctrain.runtime import PreemptionGuard
    from hpctrain.runtime.guard import timeout_margin_s
    from hpctrain.runtime.requeue import rank0_probe

    return PreemptionGuard(job_now=rank0_probe(rank), timeout_margin_s=timeout_margin_s(), watch=False)


def main(argv: list[str] | None = None) -> int:
    times = {"main": time.time()}  # start-up milestones, journaled after the first step
    args = parse_args(argv)
    # First of all: a notice during the seconds of start-up is then kept rather than fatal (USR2's default)
    guard = preemption_guard(JobEnvironment().rank)
    try:
        spec = load_job_spec(args.spec)
        if (params := JobEnvironment().params) is not None:  # an array task's (a sweep trial's)
            spec = spec.with_params(params)
        spec = spec.on_nodes(JobEnvironment().step_node_count)  # of its shapes, the one Slurm allocated
        watchdog = RankWatchdog(hang_timeouts(spec))
        watchdog.phase("start-up")
        # DeepSpeed prints its set-up (and binds its log handler) to stdout: keep stdout for the step lines
        with contextlib.redirect_stdout(sys.stderr):
            from hpctrain.train.engine import build_engine, train

            engine = build_engine(spec)
        times["engine"] = time.time()
        model = spec.model or Model()
        dp_rank, dp_size = engine.grid.get_data_parallel_rank(), engine.grid.get_data_parallel_world_size()
        from hpctrain.train.evaluation import data_split

        split = data_split(spec)
        loader = None
        if split.train is not None:
            from hpctrain.data import ShardLoader
            from hpctrain.data.cache import node_cache

            loader = ShardLoader(
                split.train,
                batch_size=spec.parallel.micro_batch,
                dp_rank=dp_rank,
                dp_size=dp_size,
                workers=spec.data.workers,
                seed=spec.seed,
                shuffle_buffer=spec.data.shuffle_buffer,
                max_quarantined_fraction=spec.data.max_quarantined_fraction,
                cache=node_cache(spec.data.cache),
            )
        evaluation = None
        if split.held_out is not None:
            from hpctrain.train.evaluation import EvalSchedule, HeldOutEval

            held_out = HeldOutEval(spec, split.held_out, dp_rank, dp_size)
            evaluation = EvalSchedule(spec, held_out, args.steps, Journal.from_env())
        checkpoints = None
        if spec.checkpoint.dir is not None:
            from hpctrain.checkpoint.naming import task_dir
            from hpctrain.train.checkpointing import TrainCheckpoints

            task = JobEnvironment().task_index
            checkpoints = TrainCheckpoints(spec, engine, task_dir(spec.checkpoint.dir, task), loader, evaluation)
        start = checkpoints.resume() if checkpoints else 0
        times["loaded"] = time.time()
    except HpctrainError as exc:
        print(f"hpctrain.train: error: {exc}", file=sys.stderr)
        return 2
    if loader is not None:
        from hpctrain.train.dataset import loader_batches

        batches = loader_batches(loader)
    else:
        from hpctrain.train.synthetic import micro_batches

        batches = micro_batches(model, spec.parallel, spec.seed, dp_rank, start_step=start)
    tokens = spec.parallel.samples_per_step * model.seq_len
    compute = ComputeTimer(engine.module, stage=engine.grid.get_stage_id())
    # The evaluation comes before the checkpoint: a checkpoint's manifest records its step's eval metrics.
    hooks = [step_printer(tokens), metrics_journal(tokens, loader), compute]
    hooks += ([evaluation] if evaluation else []) + ([checkpoints.hook] if checkpoints else [])
    tier = checkpoints.tier if checkpoints else None
    if start and engine.global_rank == 0:
        print(f"hpctrain.train: resumed at step {start} from the {tier} tier", file=sys.stderr)
    try:
        for n in range(max(args.steps - start, 0)):
            # The first step is start-up's, as `journal_startup` counts it and as a user's loop under the guard is
            # timed: its collectives' set-up and the loader's first batch (on GPUs kernels' tuning and compilation)
            # may take many steps' time (after a restart under CI's load, a third of the hung-rank test's step_s).
            if n:
                watchdog.phase("step")
            (result,) = train(engine, batches, 1, hooks=hooks)
            if n == 0:
                journal_startup(engine, start, tier, {**times, "first_step": time.time()})
            if guard.should_stop():  # every rank agrees on the same step
                watchdog.close()  # the stop's checkpoint has the grace time, not a step's
                stop_and_requeue(engine, guard, checkpoints, result)
                return 0
        watchdog.close()
        if checkpoints:
            checkpoints.close()
        journal = Journal.from_env()
        if journal is not None and engine.global_rank == 0:  # so that a stop notice that came too late requeues nothing
            journal.write("finished", step=args.steps, message=f"trained to step {args.steps}")
    finally:
        # Shuts the loader's workers down the orderly way: they ignore SIGTERM (preemption notices are
        # the trainer's), so the interpreter's exit-time terminate() could not stop them.
        batches.close()
    # Gloo torn down explicitly: left to interpreter exit, its threads sometimes abort the process.
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


def journal_startup(engine: Any, start: int, tier: str | None, times: dict[str, float]) -> None:
    """Rank 0 journals how long this run took to get going (process, engine, checkpoint load, first step) and
    the checkpoint tier it resumed from (memory, file system)."""
    journal = Journal.from_env()
    if journal is not None and engine.global_rank == 0:
        journal.write(
            "startup",
            resumed_from=start,
            tier=tier,
            times=times,
            message=f"engine {times['engine'] - times['main']:.2f}s, load {times['loaded'] - times['engine']:.2f}s, "
            f"first step {times['first_step'] - times['loaded']:.2f}s",
        )


def stop_and_requeue(engine: Any, guard: Any, checkpoints: Any, result: Any) -> None:
    """Checkpoint this step (finishing any save in flight), then requeue the job from rank 0."""
    from hpctrain.runtime.requeue import requeue_after_stop, requeues

    stopped_at = time.time()
    if checkpoints:
        checkpoints.finish(result.step, result.loss)
    checkpoint_s = time.time() - stopped_at
    if engine.global_rank != 0:
        return
    message = f"{guard.cause()} at step {result.step} (signal {guard.signal}): checkpointed, " + (
        "requeueing" if requeues(guard) else "exiting"
    )
    print(f"hpctrain.train: {message}", file=sys.stderr, flush=True)
    requeue_after_stop(
        guard,
        message,
        step=result.step,
        checkpointed=bool(checkpoints),
        stopped_at=stopped_at,
        checkpoint_s=checkpoint_s,
    )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        # A failed rank leaves at once: its peers may be gone, and a save in flight or gloo's threads would hold the
        # interpreter's exit until Slurm's KillWait (SIGTERM only asks the guard for a stop; from 24.11 srun's
        # --kill-on-bad-exit sends it first), delaying the restart in the allocation by as much.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
