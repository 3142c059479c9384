"""A cheap sweep trial with a known objective: loss = (x - 0.3)^2 + (y + 0.2)^2 (+ a decaying term).

    python sweep_trial.py [--steps N] [--step-s SECONDS] [--stop-file PATH]

Reads its parameters (x, y) from $HPCTRAIN_PARAMS, as every array task of a sweep does, and reports
the loss at each step with `hpctrain.runtime.log_metrics`; the last step's loss is the objective.
With --stop-file, it ends after the step at which PATH exists (or after N steps): a test decides when
trials end, whatever the machine's speed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from hpctrain.runtime import log_metrics


def objective(x: float, y: float) -> float:
    return (x - 0.3) ** 2 + (y + 0.2) ** 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--stop-file", type=Path, default=None)
    args = parser.parse_args()
    params = json.loads(os.environ.get("HPCTRAIN_PARAMS") or "{}")
    final = objective(float(params.get("x", 0.0)), float(params.get("y", 0.0)))
    for step in range(1, args.steps + 1):
        time.sleep(args.step_s)
        last = step == args.steps or (args.stop_file is not None and args.stop_file.exists())
        log_metrics(step, loss=final if last else final + (args.steps - step) / args.steps)  # the last is the objective
        if last:
            break
    print(json.dumps({"params": params, "loss": final}))


if __name__ == "__main__":
    main()
