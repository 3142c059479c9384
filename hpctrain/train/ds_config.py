"""The DeepSpeed config dict of a job spec (pure data: imports neither torch nor deepspeed).

Optimizer settings come from ``spec.hyperparameters``: lr, betas, eps, weight_decay, grad_clip.
"""

from __future__ import annotations

from typing import Any

from hpctrain.config.job import JobSpec
from hpctrain.errors import ConfigError

DEFAULTS: dict[str, Any] = {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "grad_clip": 1.0}
# the pipeline engine rejects ZeRO-2/3 (they partition gradients, which its schedule owns)
PIPELINE_ZERO_STAGES = (0, 1)


def ds_config(spec: JobSpec) -> dict[str, Any]:
    p = spec.parallel
    if p.zero_stage not in PIPELINE_ZERO_STAGES:
        raise ConfigError(
            f"parallel.zero_stage = {p.zero_stage}: the reference trainer runs DeepSpeed's "
            "pipeline engine, which supports ZeRO stage 0 or 1 only"
        )
    unknown = sorted(set(spec.hyperparameters) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"hyperparameters: unknown {', '.join(unknown)} (known: {', '.join(DEFAULTS)})")
    hp = {**DEFAULTS, **spec.hyperparameters}
    return {
        "train_micro_batch_size_per_gpu": p.micro_batch,
        "gradient_accumulation_steps": p.grad_accum,
        "train_batch_size": p.samples_per_step,
        "zero_optimization": {"stage": p.zero_stage},
        "bf16": {"enabled": p.precision == "bf16"},
        "optimizer": {
            "type": "AdamW",
            # torch's AdamW: DeepSpeed's fused Adam would JIT-compile an extension (minutes)
            "params": {
                "torch_adam": True,
                "lr": hp["lr"],
                "betas": list(hp["betas"]),
                "eps": hp["eps"],
                "weight_decay": hp["weight_decay"],
            },
        },
        "gradient_clipping": hp["grad_clip"],
        "steps_per_print": 2**62,
        "wall_clock_breakdown": False,
    }
