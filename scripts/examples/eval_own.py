"""An evaluator for `own_loop.py`'s checkpoints (docs/own-loop-to-model.md): the mean squared error on batches
the loop never trains on.

    [eval.evaluators]
    mse = ["python", "scripts/examples/eval_own.py"]

The evaluation job gives it the checkpoint ($HPCTRAIN_EVAL_CHECKPOINT, every chunk verified already); it writes
{"mse": ...} to $HPCTRAIN_EVAL_OUTPUT.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from hpctrain.checkpoint import load_flat
from hpctrain.contract import EVAL_CHECKPOINT_ENV, EVAL_OUTPUT_ENV

sys.path.insert(0, str(Path(__file__).parent))
from own_loop import batch  # noqa: E402

HELD_OUT = range(1_000_000, 1_000_004)  # steps the loop never reaches: data it never saw


def main() -> int:
    weight = load_flat(os.environ[EVAL_CHECKPOINT_ENV], ["model/weight"])["model/weight"]
    errors = [torch.nn.functional.mse_loss(x @ weight.T.squeeze(1), y).item() for x, y in map(batch, HELD_OUT)]
    Path(os.environ[EVAL_OUTPUT_ENV]).write_text(json.dumps({"mse": sum(errors) / len(errors)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
