"""Your own training loop whose checkpoints `hpctrain eval` and `hpctrain model register` can use
(docs/own-loop-to-model.md).

    python own_loop.py CHECKPOINT_DIR

A linear model fitted to y = X @ w_true + noise, one process. Its hyperparameters (``lr``, ``steps``,
``save_every``) come from the job spec; its checkpoints are hpctrain's (`Checkpointer`): sharded,
checksummed, committed atomically and journaled, so the ledger knows them. On the preemption notice the
loop saves at the step it reached and exits; the requeued run resumes from the newest checkpoint.
"""

from __future__ import annotations

import sys
import time

import torch

from hpctrain.checkpoint import Checkpointer, Retention
from hpctrain.contract import JobEnvironment
from hpctrain.runtime import PreemptionGuard, log_metrics

FEATURES = 8


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The training batch of ``step``: drawn from the step alone, so a resumed run sees the same data."""
    g = torch.Generator().manual_seed(step)
    x = torch.randn(32, FEATURES, generator=g)
    w_true = torch.arange(1.0, FEATURES + 1)
    return x, x @ w_true + 0.01 * torch.randn(32, generator=g)


def main(directory: str) -> int:
    hp = {"lr": 0.05, "steps": 60, "save_every": 20, **JobEnvironment().hyperparameters}
    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=hp["lr"])
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0}
    ck = Checkpointer(directory, retention=Retention(keep_last=3), layout={"dp": 1, "tp": 1, "pp": 1})
    if restored := ck.load_latest(like=state):  # fills the tensors in place; None on a fresh start
        opt.load_state_dict(restored.state["optim"])
        state["step"] = restored.state["step"]
    guard = PreemptionGuard()
    step = state["step"]
    while step < hp["steps"]:
        started = time.perf_counter()
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        log_metrics(step, loss=loss.item(), step_time_s=time.perf_counter() - started)  # step_time_s: goodput
        stop = guard.should_stop()
        if stop or step % hp["save_every"] == 0 or step == hp["steps"]:
            state.update(optim=opt.state_dict(), step=step)
            ck.save(step, state, metrics={"loss": loss.item()})
        if stop:
            break
    guard.finish()
    ck.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
