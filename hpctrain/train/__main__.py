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

from hpctrain.config.job import Model, load_job_spec
from hpctrain.errors import HpctrainError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.train", description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=os.environ.get("HPCTRAIN_SPEC"), help="job spec (default: $HPCTRAIN_SPEC)")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps to run")
    args = parser.parse_args(argv)
    if not args.spec:
        parser.error("give --spec or set HPCTRAIN_SPEC")
    return args


def step_printer(tokens_per_step: int):
    """A step hook that prints the step's JSON line on global rank 0."""

    def hook(engine, result) -> None:
        if engine.global_rank == 0:
            print(json.dumps({"step": result.step, "loss": result.loss, "step_time_s": result.step_time_s,
                              "tokens_per_s": tokens_per_step / result.step_time_s}), flush=True)

    return hook


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = load_job_spec(args.spec)
        # DeepSpeed prints its set-up (and binds its log handler) to stdout: keep stdout for the step lines
        with contextlib.redirect_stdout(sys.stderr):
            from hpctrain.train.engine import build_engine, train
            from hpctrain.train.synthetic import micro_batches

            engine = build_engine(spec)
    except HpctrainError as exc:
        print(f"hpctrain.train: error: {exc}", file=sys.stderr)
        return 2
    model = spec.model or Model()
    batches = micro_batches(model, spec.parallel, spec.seed, engine.grid.get_data_parallel_rank())
    train(engine, batches, args.steps, hooks=[step_printer(spec.parallel.samples_per_step * model.seq_len)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
