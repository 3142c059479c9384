"""python -m hpctrain.evaluate --of JOB --task T --step N --checkpoint DIR --evaluator NAME [-- CMD...]: one
evaluation, as an evaluation job runs it (`hpctrain eval` writes that command line).

Verifies the checkpoint, runs the evaluator (`heldout`: hpctrain's held-out loss of the reference GPT, with this
job's spec; otherwise CMD, see `hpctrain.evaluate.run`) and journals an "evaluation" record with its metrics or
its error. Exit status: 0 with a result, 1 without (the error on stderr, one line), 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hpctrain.contract import SPEC_ENV, JobEnvironment
from hpctrain.errors import HpctrainError
from hpctrain.evaluate.run import BUILT_IN, EvaluationError, Target, run_command, verified_layout
from hpctrain.ledger.journal import Journal


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hpctrain.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("--of", type=int, required=True, help="the ledger id of the job whose checkpoint this is")
    parser.add_argument("--task", type=int, default=-1, help="its array task (-1: a plain job)")
    parser.add_argument("--step", type=int, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--evaluator", required=True, help=f"{BUILT_IN}, or the name of CMD")
    parser.add_argument("command", nargs="*", metavar="CMD", help="the evaluator's command (after --)")
    args = parser.parse_args(argv)
    if (args.evaluator == BUILT_IN) == bool(args.command):
        parser.error(f"give CMD after -- for an evaluator other than {BUILT_IN}, and none for {BUILT_IN}")
    return args


def evaluate(args: argparse.Namespace, target: Target) -> dict[str, float]:
    layout = verified_layout(target)
    if args.command:
        return run_command(args.evaluator, args.command, target, layout)
    from hpctrain.config.job import load_recorded_job_spec
    from hpctrain.evaluate.heldout import heldout_metrics

    spec_file = JobEnvironment().spec_file
    if not spec_file:
        raise EvaluationError(f"evaluator {BUILT_IN}: no job spec (${SPEC_ENV}) to read [model] and [eval] from")
    return heldout_metrics(load_recorded_job_spec(spec_file), target.checkpoint)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    target = Target(args.of, args.task, args.step, args.checkpoint)
    where = f"job {target.job_id} step {target.step} ({args.evaluator})"
    try:
        outcome: dict[str, Any] = {"metrics": evaluate(args, target)}
        message = ", ".join(f"{k} {v:.6g}" for k, v in outcome["metrics"].items())
        print(f"hpctrain.evaluate: {where}: {message}", flush=True)
    except HpctrainError as exc:
        outcome, message = {"error": str(exc)}, str(exc)
        print(f"hpctrain.evaluate: error: {exc}", file=sys.stderr)
    journal = Journal.from_env()
    if journal is not None:
        journal.write(
            "evaluation",
            of_job=target.job_id,
            of_task=target.task_index,
            step=target.step,
            evaluator=args.evaluator,
            message=f"{where}: {message}",
            **outcome,
        )
    return 0 if "metrics" in outcome else 1


if __name__ == "__main__":
    sys.exit(main())
