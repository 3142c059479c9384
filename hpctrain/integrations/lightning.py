"""PyTorch Lightning under hpctrain: hpctrain's guard instead of Lightning's own SLURM auto-requeue. On a
preemption or time-limit notice the run saves a Lightning checkpoint at the batch boundary and stops; the
batch script requeues the job and the next run resumes with ``ckpt_path``. `HpctrainLogger` takes what the
module logs (``self.log(...)``) into the job's ledger at the global step, from rank 0 only.

    callback = HpctrainCallback(checkpoint_dir)
    trainer = lightning.Trainer(..., callbacks=[callback], logger=HpctrainLogger())
    trainer.fit(model, data, ckpt_path=last_checkpoint(checkpoint_dir))
    if callback.stopped:
        sys.exit(0)          # requeued: skip what follows training

Lightning, seeing SLURM, would handle the signals itself: SIGUSR1 saves and runs `scontrol requeue`
(auto-requeue), and SIGTERM makes the next batch raise `SIGTERMException` without saving. Both would fight
hpctrain's notice (USR2 from the batch script, SIGTERM from Slurm at the start of a preemption's grace
time), so the callback turns auto-requeue off before Lightning installs its handlers and puts the guard's
back once it has. A mid-epoch resume is exact only with a resumable dataloader (`state_dict` /
`load_state_dict`), as Lightning itself warns.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only

from hpctrain.contract import JobEnvironment
from hpctrain.runtime.guard import PreemptionGuard
from hpctrain.runtime.metrics import log_metrics


class HpctrainCallback(L.Callback):
    """Asks hpctrain's guard after every training batch (collective: every rank stops at the same one); on a
    notice saves ``<checkpoint_dir>/step-N.ckpt`` through the Trainer and stops. Build it in the main thread."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str], guard: PreemptionGuard | None = None):
        self.checkpoint_dir = Path(checkpoint_dir)
        self.guard = guard or PreemptionGuard()
        self.stopped = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Where Lightning's signal connector reads it: single-device strategies have no public one.
        environment = getattr(trainer._accelerator_connector, "cluster_environment", None)
        if isinstance(environment, SLURMEnvironment):
            environment.auto_requeue = False  # hpctrain's batch script requeues

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.guard.reinstall()  # over Lightning's SIGTERM handler, which would stop without saving

    def on_train_batch_end(self, trainer: L.Trainer, *args: object) -> None:
        if self.guard.should_stop():
            trainer.save_checkpoint(self.checkpoint_dir / f"step-{trainer.global_step}.ckpt")
            trainer.should_stop = self.stopped = True
            # Lightning validates before a requested stop: the grace time is the checkpoint's, not a validation's
            # (the flag is not in the checkpoint, so the resumed run validates as a straight one would).
            trainer.fit_loop.epoch_loop._skip_next_val = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.guard.finish()  # what follows fitting (testing, the export) is not a step; a notice then stops nothing


class HpctrainLogger(Logger):
    """Lightning's logged values into the job's journal (`hpctrain.runtime.log_metrics`), by their ``self.log``
    names, at the trainer's global step; a step logged again after a resume replaces the values before."""

    @property
    def name(self) -> str:
        return "hpctrain"

    @property
    def version(self) -> str:
        job = JobEnvironment().job_id
        return "local" if job is None else str(job)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if step is not None:
            log_metrics(step, **{k: float(v) for k, v in metrics.items() if k != "epoch"})

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Nothing: the job's hyperparameters are in its spec, in the ledger already."""


def last_checkpoint(checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """The newest ``step-N.ckpt`` in ``checkpoint_dir``: the callback's, and a `ModelCheckpoint`'s saved with
    ``filename="step-{step}", auto_insert_metric_name=False``; None on a first run."""
    found = [
        (int(m[1]), p)
        for p in Path(checkpoint_dir).glob("step-*.ckpt")
        if (m := re.fullmatch(r"step-(\d+)\.ckpt", p.name))
    ]
    return str(max(found)[1]) if found else None
