"""Hugging Face Transformers' `Trainer` under hpctrain: on a preemption or time-limit notice, save through
the Trainer's own checkpointing at the step boundary and stop; the batch script requeues the job, and the
next run resumes with ``resume_from_checkpoint``. What the Trainer logs (training loss, learning rate, and
its evaluations' ``eval_*`` values, journaled as ``eval/*``) goes into the job's ledger at the Trainer's
global step, from the main process only.

    callback = HpctrainCallback()
    trainer = Trainer(..., data_collator=BatchSeeded(collator), callbacks=[callback])
    trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))
    if callback.stopped:
        sys.exit(0)          # requeued: skip what follows training (evaluation, the final save)

The Trainer's checkpoint keeps the model, optimizer, scheduler, its RNG states and where the epoch was, but not
the random state of a collator that draws (`DataCollatorForLanguageModeling`'s masking): that state lives in the
DataLoader's workers, restarted with each epoch, and a resumed run skips the epoch's first batches without
collating them, so its masks differ from an uninterrupted run's. `BatchSeeded` draws each batch's randomness from
the batch itself: the same masks whenever the same batch comes, in any worker, after any resume.
"""

from __future__ import annotations

import hashlib
import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from hpctrain.runtime.guard import PreemptionGuard
from hpctrain.runtime.metrics import log_metrics


class HpctrainCallback(TrainerCallback):
    """Asks hpctrain's guard after every optimizer step (collective: every rank stops at the same step);
    on a notice the Trainer saves a checkpoint of that step (model, optimizer, scheduler, RNG, data
    position) and stops. Build it in the main thread, before training: it installs the signal handlers."""

    def __init__(self, guard: PreemptionGuard | None = None):
        self.guard = guard or PreemptionGuard()
        self.stopped = False

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.guard.should_stop():
            control.should_save = control.should_training_stop = self.stopped = True
        return control

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.guard.finish()  # the final save and evaluation are not a step; a notice then stops nothing

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """The Trainer's logged values (its evaluations' too: `Trainer.evaluate` logs them) into the journal; a
        step logged again after a resume replaces the values before."""
        if state.is_world_process_zero and logs:
            values = {_name(k): v for k, v in logs.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            log_metrics(state.global_step, **values)


def _name(key: str) -> str:
    """The Trainer's ``eval_loss`` as hpctrain's ``eval/loss`` (the report draws it beside the training loss)."""
    return f"eval/{key[len('eval_') :]}" if key.startswith("eval_") else key


def last_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The Trainer's newest ``checkpoint-N`` in ``output_dir`` to resume from; None on a first run."""
    return get_last_checkpoint(str(output_dir)) if os.path.isdir(output_dir) else None


class BatchSeeded:
    """A data collator whose random draws (torch's, NumPy's and Python's global generators) come from a seed made of
    ``seed`` and the batch's contents, the surrounding random state left as it was. Leave the wrapped collator's own
    ``seed`` unset: a generator of its own would go on drawing from its state. Two identical batches get the same
    draws (a sample gets another mask in another batch)."""

    def __init__(self, collator: Callable[[Sequence[Any]], Any], seed: int = 0) -> None:
        self.collator, self.seed = collator, seed

    def batch_seed(self, features: Sequence[Any]) -> int:
        digest = hashlib.blake2b(self.seed.to_bytes(8, "little", signed=True), digest_size=8)
        for feature in features:
            for key, value in sorted(feature.items()) if isinstance(feature, Mapping) else [("", feature)]:
                digest.update(str(key).encode())
                digest.update(np.asarray(value.numpy() if isinstance(value, torch.Tensor) else value).tobytes())
        return int.from_bytes(digest.digest(), "little") >> 1

    def __call__(self, features: Sequence[Any]) -> Any:
        seed = self.batch_seed(features)
        python, numpy = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
            try:
                return self.collator(features)
            finally:
                random.setstate(python)
                np.random.set_state(numpy)
