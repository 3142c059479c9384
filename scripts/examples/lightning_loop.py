"""A PyTorch Lightning run, preemption-safe with hpctrain (see hpctrain.integrations.lightning).

    python lightning_loop.py CKPT_DIR [--steps 200] [--step-s 0] [--progress FILE]

A small regression model on the CPU, checkpointed every 50 steps by Lightning's `ModelCheckpoint` and on
the notice by hpctrain's callback, resumed from the newest with ``ckpt_path``; validated every 50 steps on
data it never trains on. What it logs (train_loss, eval/loss) goes into the job's ledger through
hpctrain's logger. Its dataloader is resumable
mid-epoch (each epoch's order comes from the seed and the epoch; a resumed run skips the batches already
taken), so a preempted run equals one never preempted. Final weights: CKPT_DIR/final.pt. ``--step-s`` and
``--progress`` only slow the steps down and record them, to watch a preemption happen.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Iterator

import lightning as L
import torch

from hpctrain.integrations.lightning import HpctrainCallback, HpctrainLogger, last_checkpoint

from _watch import arguments, record


class Batches:
    """Shuffled batches of a tensor dataset, resumable mid-epoch (Lightning's `state_dict` protocol)."""

    def __init__(self, data: torch.Tensor, batch_size: int, seed: int = 0):
        self.data, self.batch_size, self.seed = data, batch_size, seed
        self.epoch, self.taken, self._skip = 0, 0, 0

    def __len__(self) -> int:
        return len(self.data) // self.batch_size

    def __iter__(self) -> Iterator[torch.Tensor]:
        order = torch.randperm(len(self.data), generator=torch.Generator().manual_seed(self.seed + self.epoch))
        start, self._skip = self._skip, 0
        for i in range(start, len(self)):
            self.taken = i + 1
            yield self.data[order[i * self.batch_size:(i + 1) * self.batch_size]]
        self.epoch, self.taken = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "taken": self.taken}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self._skip = state["epoch"], state["taken"]


class Regression(L.LightningModule):
    def __init__(self, step_s: float = 0.0, progress: Path | None = None):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
        self.step_s, self.progress = step_s, progress

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch), batch.sum(dim=1, keepdim=True).sin())

    def training_step(self, batch: torch.Tensor, index: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: torch.Tensor, index: int) -> None:
        self.log("eval/loss", self.loss(batch))  # hpctrain's name for a held-out loss: its report draws it

    def on_train_batch_end(self, *args: Any) -> None:
        record(self.progress, self.global_step)
        time.sleep(self.step_s)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> int:
    args = arguments(__doc__, "ckpt_dir").parse_args()
    torch.manual_seed(0)
    model = Regression(args.step_s, args.progress)
    data = Batches(torch.randn(512, 16, generator=torch.Generator().manual_seed(1)), batch_size=8)
    held_out = torch.utils.data.DataLoader(torch.randn(128, 16, generator=torch.Generator().manual_seed(2)), batch_size=32)
    hpctrain = HpctrainCallback(args.ckpt_dir)
    periodic = L.pytorch.callbacks.ModelCheckpoint(args.ckpt_dir, filename="step-{step}", auto_insert_metric_name=False,
                                                   every_n_train_steps=50, save_top_k=-1)
    trainer = L.Trainer(max_steps=args.steps, accelerator="cpu", devices=1, callbacks=[hpctrain, periodic],
                        logger=HpctrainLogger(), log_every_n_steps=25, val_check_interval=50,
                        check_val_every_n_epoch=None, num_sanity_val_steps=0, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(model, train_dataloaders=data, val_dataloaders=held_out, ckpt_path=last_checkpoint(args.ckpt_dir))
    if hpctrain.stopped:
        print(f"stopped on the notice at step {trainer.global_step}: checkpoint saved", flush=True)
        return 0
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.save(model.net.state_dict(), args.ckpt_dir / "final.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
