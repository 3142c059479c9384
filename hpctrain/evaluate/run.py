"""What an evaluation job runs: verify the checkpoint, run the evaluator, check its metrics, journal the outcome.

A user's evaluator is a command that finds the checkpoint's path, step and layout in its environment
(`contract.EVAL_CHECKPOINT_ENV`, ...) and writes a JSON object of finite numbers to the file
`contract.EVAL_OUTPUT_ENV` names. Any failure (the checkpoint fails verification, the command exits non-zero or
writes no or invalid JSON) is one line, journaled as the evaluation's error: no result is recorded.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.contract import EVAL_CHECKPOINT_ENV, EVAL_LAYOUT_ENV, EVAL_OUTPUT_ENV, EVAL_STEP_ENV
from hpctrain.errors import HpctrainError

BUILT_IN = "heldout"  # hpctrain's held-out loss of the reference GPT (`hpctrain.evaluate.heldout`)


class EvaluationError(HpctrainError):
    """An evaluation that gives no result: the checkpoint, the evaluator or its output is at fault."""


@dataclass(frozen=True)
class Target:
    """The checkpoint an evaluation job evaluates: of which job's task, at which step, where."""

    job_id: int
    task_index: int
    step: int
    checkpoint: Path


def verified_layout(target: Target) -> dict[str, Any]:
    """The checkpoint's layout, once every chunk's checksum matched (EvaluationError otherwise)."""
    from hpctrain.checkpoint.reader import verify

    try:
        manifest = verify(target.checkpoint)
    except HpctrainError as exc:
        raise EvaluationError(f"{target.checkpoint}: fails verification: {exc}") from None
    if manifest.step != target.step:
        raise EvaluationError(f"{target.checkpoint}: holds step {manifest.step}, not step {target.step}")
    return dict(manifest.data.get("layout", {}))


def run_command(name: str, command: Sequence[str], target: Target, layout: dict[str, Any]) -> dict[str, float]:
    """The metrics the user's evaluator ``command`` wrote for ``target``."""
    with tempfile.TemporaryDirectory(prefix="hpctrain-eval-") as tmp:
        out = Path(tmp) / "metrics.json"
        env = {
            **os.environ,
            EVAL_CHECKPOINT_ENV: str(target.checkpoint),
            EVAL_STEP_ENV: str(target.step),
            EVAL_LAYOUT_ENV: json.dumps(layout),
            EVAL_OUTPUT_ENV: str(out),
        }
        try:
            done = subprocess.run(list(command), env=env)
        except OSError as exc:
            raise EvaluationError(f"evaluator {name}: cannot run {command[0]!r}: {exc.strerror}") from None
        if done.returncode != 0:
            raise EvaluationError(f"evaluator {name}: {command[0]} exited {done.returncode}")
        if not out.exists():
            raise EvaluationError(f"evaluator {name}: wrote no metrics (expected a JSON object in ${EVAL_OUTPUT_ENV})")
        return parse_metrics(name, out.read_text(encoding="utf-8", errors="replace"))


def parse_metrics(name: str, text: str) -> dict[str, float]:
    """A JSON object of finite numbers by metric name; EvaluationError naming what is wrong."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise EvaluationError(f"evaluator {name}: its metrics are not JSON ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise EvaluationError(f"evaluator {name}: its metrics must be a JSON object of numbers by name")
    bad = [k for k, v in data.items() if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)]
    if bad:
        raise EvaluationError(f"evaluator {name}: {bad[0]!r} is {data[bad[0]]!r}, not a finite number")
    return {k: float(v) for k, v in data.items()}
