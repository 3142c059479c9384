"""Your own training loop, preemption-safe with hpctrain.runtime in a few lines.

    python guarded_loop.py STATE_FILE STEPS

Run it as the command of an hpctrain job spec. On the preemption or time-limit notice every rank
stops at the same step (`should_stop` is collective under torch.distributed), the loop saves its
state and exits; hpctrain's batch script then requeues the job (only this task, in an array), and
the next run resumes from the saved state. hpctrain's own trainer does the same with sharded
checkpoints (`python -m hpctrain.train`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hpctrain.runtime import PreemptionGuard


def main(state_file: Path, steps: int) -> int:
    state = json.loads(state_file.read_text()) if state_file.exists() else {"step": 0, "total": 0}
    guard = PreemptionGuard()
    while state["step"] < steps:
        time.sleep(0.2)  # one training step
        state["step"] += 1
        state["total"] += state["step"]
        if guard.should_stop():
            break
    guard.finish()  # what follows the loop is not a step (with [hang]); a notice then stops nothing
    tmp = state_file.with_name(state_file.name + ".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, state_file)  # atomic: a run killed mid-write leaves the previous state
    print(f"stopped at step {state['step']} of {steps}" if state["step"] < steps else "done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), int(sys.argv[2])))
