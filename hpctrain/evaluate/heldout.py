"""The built-in evaluator: the reference GPT's held-out loss on a checkpoint, in one process, on the same samples
the training loop evaluates (the spec's `[eval]`), so a job's result at step N matches the loop's own at N."""

from __future__ import annotations

from pathlib import Path

from hpctrain.config.job import JobSpec, Model
from hpctrain.errors import ConfigError


def heldout_metrics(spec: JobSpec, checkpoint: Path) -> dict[str, float]:
    from hpctrain.train.evaluation import HeldOutEval, data_split
    from hpctrain.train.sample import load_model

    if spec.model is None:
        raise ConfigError(f"{spec.name}: the heldout evaluator evaluates the reference GPT: the spec has no [model]")
    held_out = data_split(spec).held_out
    if held_out is None:
        raise ConfigError(f"{spec.name}: the heldout evaluator needs held-out data: set eval.index or eval.holdout")
    return HeldOutEval(spec, held_out, 0, 1).evaluate_module(load_model(spec.model or Model(), checkpoint))
