"""An evaluator for `hpctrain eval`: the reference GPT's perplexity per byte on a text it never trained on.

    [eval.evaluators]
    ppl = ["python", "scripts/examples/eval_ppl.py", "--corpus", "/path/to/held-out.txt"]

The evaluation job gives it the checkpoint ($HPCTRAIN_EVAL_CHECKPOINT) and the job's spec ($HPCTRAIN_SPEC: the
model's shape); it reads up to --bytes of the corpus as sequences of the model's length and writes
{"ppl": e^loss, "bpb": bits per byte, "bytes": bytes read} to $HPCTRAIN_EVAL_OUTPUT.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch

from hpctrain.config import load_job_spec
from hpctrain.contract import EVAL_CHECKPOINT_ENV, EVAL_OUTPUT_ENV, JobEnvironment
from hpctrain.train.model import lm_loss
from hpctrain.train.sample import load_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--bytes", type=int, default=65536)
    args = parser.parse_args()
    model = load_job_spec(JobEnvironment().spec_file).model
    net = load_model(model, Path(os.environ[EVAL_CHECKPOINT_ENV]))
    size = model.seq_len + 1
    text = args.corpus.read_bytes()[: args.bytes]
    rows = [torch.frombuffer(bytearray(text[i : i + size]), dtype=torch.uint8) for i in range(0, len(text) - size + 1, size)]
    if not rows:
        print(f"eval_ppl.py: {args.corpus}: shorter than one sequence of {size} bytes", file=sys.stderr)
        return 1
    tokens = torch.stack(rows).long()
    with torch.no_grad():
        losses = [float(lm_loss(net(b[:, :-1]), b[:, 1:])) for b in tokens.split(32)]
    loss = sum(l * len(b) for l, b in zip(losses, tokens.split(32))) / len(tokens)
    metrics = {"ppl": math.exp(loss), "bpb": loss / math.log(2), "bytes": len(tokens) * size}
    Path(os.environ[EVAL_OUTPUT_ENV]).write_text(json.dumps(metrics))
    return 0


if __name__ == "__main__":
    sys.exit(main())
