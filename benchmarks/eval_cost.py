"""In-loop evaluation's cost as a share of training time, at the quickstart's size and cadence.

    .venv/bin/python benchmarks/eval_cost.py [--steps 200]

Runs the quickstart's spec (scripts/examples/gpt-tiny.toml: the reference GPT, tp=2 x pp=2, 4 ranks under
torchrun on this host) on standard-library text for --steps steps, evaluating its `[eval]` (8 global batches
every 50 steps and at the last). The baseline is the same run's training: the seconds the evaluations held
the loop up (the journal's eval/time_s) over the seconds of its training steps (step_time_s). Goal: at most
10 % of the training time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hpctrain.config import load_job_spec
from hpctrain.contract import EVAL_LOSS, EVAL_TIME
from hpctrain.data.text import pack_text
from hpctrain.ledger.journal import Journal

from _figures import figure

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    spec = load_job_spec(REPO / "scripts" / "examples" / "gpt-tiny.toml")
    with tempfile.TemporaryDirectory(prefix="hpctrain-eval-cost-") as tmp:
        work = Path(tmp)
        train, held = pack_text(work / "text", [], spec.model.seq_len, 2 * 2**20, 16 * 2**20, held_out_bytes=2**20)
        assert held is not None
        data = spec.model_dump(mode="json", by_alias=True, exclude_none=True)
        data["data"]["index"], data["eval"]["index"] = str(train.path), str(held.path)
        data["checkpoint"] = {}
        (work / "spec.json").write_text(json.dumps(data))
        torchrun = Path(sys.executable).with_name("torchrun")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HPCTRAIN_JOURNAL_DIR": str(work / "journal"), "HPCTRAIN_JOB_ID": "1"}
        done = subprocess.run(
            [str(torchrun), "--standalone", "--nproc-per-node", str(spec.parallel.world_size), "-m", "hpctrain.train",
             "--spec", str(work / "spec.json"), "--steps", str(args.steps)],
            capture_output=True, text=True, env=env, cwd=REPO,
        )
        if done.returncode != 0:
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        records = [r["values"] for _, r in Journal(work / "journal").records(["metrics"])]
    steps = [r["step_time_s"] for r in records if "step_time_s" in r]
    evals = [r for r in records if EVAL_TIME in r]
    train_s, eval_s = sum(steps), sum(r[EVAL_TIME] for r in evals)
    print(f"{len(steps)} steps in {train_s:.1f} s (median {statistics.median(steps):.3f} s); {len(evals)} evaluations "
          f"of {spec.eval.batches} global batches in {eval_s:.1f} s (median {statistics.median(r[EVAL_TIME] for r in evals):.3f} s); "
          f"last {EVAL_LOSS} {evals[-1][EVAL_LOSS]:.3f}")
    share = 100 * eval_s / train_s
    figure(f"eval every {spec.eval.every_steps} steps / training time", share, "%", goal="<= 10 %", met=share <= 10)
    figure("one evaluation / median step", statistics.median(r[EVAL_TIME] for r in evals) / statistics.median(steps),
           "steps", goal="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
