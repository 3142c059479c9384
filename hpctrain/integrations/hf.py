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
the batch itself: the same masks whenever the same batch comes, in any worker, after any resume. When training
begins, the callback looks at the Trainer's collator: one that may draw and is not so wrapped, or a `BatchSeeded`
around a collator with a ``seed`` of its own, gets a warning on stderr and a ``resume_not_bitwise`` event in the
job's journal (`show` lists it, `status` flags the job).
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
    DataCollatorWithPadding,
    DefaultDataCollator,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
    default_data_collator,
)
from transformers.trainer_utils import get_last_checkpoint

from hpctrain.contract import RESUME_NOT_BITWISE
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.guard import PreemptionGuard
from hpctrain.runtime.metrics import log_metrics


class HpctrainCallback(TrainerCallback):
    """Asks hpctrain's guard after every optimizer step (collective: every rank stops at the same step);
    on a notice the Trainer saves a checkpoint of that step (model, optimizer, scheduler, RNG, data
    position) and stops. Build it in the main thread, before training: it installs the signal handlers."""

    def __init__(self, guard: PreemptionGuard | None = None):
        self.guard = guard or PreemptionGuard()
        self.stopped = False

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        """Say once, from the main process, when the collator makes a resumed run differ from an uninterrupted one."""
        collator = getattr(train_dataloader, "collate_fn", None)
        if not state.is_world_process_zero or collator is None or (why := inexact_resume(collator)) is None:
            return
        message = f"this run's resume will not be bitwise: {why}"
        print(f"hpctrain: {message}", file=sys.stderr, flush=True)
        if (journal := Journal.from_env()) is not None:
            journal.write(RESUME_NOT_BITWISE, message=message)

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


# Collators that draw nothing: the same batch from the same samples, whatever the random state.
_DETERMINISTIC = (
    DefaultDataCollator,
    DataCollatorWithPadding,
    DataCollatorForSeq2Seq,
    DataCollatorForTokenClassification,
)


def inexact_resume(collator: Callable[..., Any]) -> str | None:
    """Why ``collator`` (the Trainer's, as its DataLoader holds it) makes a resumed run's batches differ from an
    uninterrupted run's; None when it does not: it draws nothing, or `BatchSeeded` seeds its draws."""
    while (inner := getattr(collator, "data_collator", None)) is not None:  # the Trainer's RemoveColumnsCollator
        collator = inner
    if isinstance(collator, BatchSeeded):
        if getattr(collator.collator, "seed", None) is not None:
            return (
                f"BatchSeeded wraps {_named(collator.collator)}, which has a seed of its own: its generator goes on "
                "drawing from its own state; leave its seed unset"
            )
        return None
    if collator is default_data_collator or isinstance(collator, _DETERMINISTIC):
        return None
    if isinstance(collator, DataCollatorForLanguageModeling) and not collator.mlm:
        return None
    return (
        f"the collator {_named(collator)} may draw at random (masking) and is not wrapped in BatchSeeded: "
        "wrap it, data_collator=BatchSeeded(collator)"
    )


def _named(collator: object) -> str:
    return getattr(collator, "__qualname__", None) or type(collator).__qualname__


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
