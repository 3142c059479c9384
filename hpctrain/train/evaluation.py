"""The reference trainer's held-out evaluation: which shards it trains on and which it evaluates, the eval
loss of the engine's current weights, and when the loop evaluates.

The evaluation reads the first ``eval.batches x parallel.global_batch`` samples of the held-out shards, the
same ones at every evaluation and under every dp x tp x pp layout: data-parallel rank r takes samples r,
r + dp, ...; the loss is the mean over all of them (every micro-batch has the same number of tokens), so it
does not depend on the layout beyond float rounding. Byte-level models (vocab 256) also get bits per byte.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from hpctrain.config.job import JobSpec, Model
from hpctrain.contract import EVAL_BPB, EVAL_LOSS, EVAL_TIME
from hpctrain.data.holdout import check_disjoint, first_samples, split_holdout
from hpctrain.data.index import ShardIndex, load_index
from hpctrain.train.sample import BYTE_VOCAB
from hpctrain.train.synthetic import Batch


@dataclass(frozen=True)
class DataSplit:
    """What the loop trains on (None: synthetic data) and what it evaluates (None: no evaluation)."""

    train: ShardIndex | None
    held_out: ShardIndex | None


def data_split(spec: JobSpec) -> DataSplit:
    """The spec's training and held-out shards (DataError when they share one, or when none are left to train on)."""
    train = load_index(spec.data.index) if spec.data.index is not None else None
    if spec.eval.holdout:
        assert train is not None  # the spec's validation asks for data.index with eval.holdout
        return DataSplit(*split_holdout(train, spec.eval.holdout))
    if spec.eval.index is None:
        return DataSplit(train, None)
    held_out = load_index(spec.eval.index)
    if train is not None:
        check_disjoint(train, held_out)
    return DataSplit(train, held_out)


class HeldOutEval:
    """This data-parallel rank's share of the evaluation samples, as micro-batches, and the loss on all of them."""

    def __init__(self, spec: JobSpec, held_out: ShardIndex, dp_rank: int, dp_size: int):
        p = spec.parallel
        self.model = spec.model or Model()
        self.micro_batch = p.micro_batch
        count = spec.eval.batches * p.samples_per_step
        rows = [torch.as_tensor(s["npy"], dtype=torch.int64) for s in first_samples(held_out, count)[dp_rank::dp_size]]
        self.tokens = torch.stack(rows)
        self.micro_batches = len(rows) // p.micro_batch

    def batches(self) -> Iterator[Batch]:
        for start in range(0, self.micro_batches * self.micro_batch, self.micro_batch):
            tokens = self.tokens[start : start + self.micro_batch]
            yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def metrics(self, loss: float) -> dict[str, float]:
        metrics = {EVAL_LOSS: loss}
        if self.model.vocab == BYTE_VOCAB:
            metrics[EVAL_BPB] = loss / math.log(2)
        return metrics

    @torch.no_grad()
    def evaluate_module(self, net: torch.nn.Module) -> dict[str, float]:
        """The held-out metrics of a whole model in this process (an evaluation job's), over the same micro-batches."""
        from hpctrain.train.model import lm_loss

        losses = [float(lm_loss(net(ids), labels)) for ids, labels in self.batches()]
        return self.metrics(sum(losses) / len(losses))

    def evaluate(self, engine) -> dict[str, float]:
        """The held-out metrics of the engine's weights (collective: every rank calls it, every rank gets them)."""
        return self.metrics(float(engine.eval_batch(self.batches(), num_micro_batches=self.micro_batches)))


class EvalSchedule:
    """A step hook that evaluates every ``eval.every_steps``, at the steps the file-system tier checkpoints
    (their manifests record the eval metrics) and at the last step; rank 0 journals them."""

    def __init__(self, spec: JobSpec, held_out: HeldOutEval, last_step: int, journal) -> None:
        self.every = spec.eval.every_steps
        self.checkpoint_due: Callable[[int], bool] = lambda step: False  # the trainer's checkpoints' (SaveSchedule)
        self.held_out, self.last_step, self.journal = held_out, last_step, journal
        self.latest: dict[int, dict[str, float]] = {}  # step -> metrics: the newest evaluation only

    def due(self, step: int) -> bool:
        return step == self.last_step or bool(self.every and step % self.every == 0) or self.checkpoint_due(step)

    def __call__(self, engine, result) -> None:
        if not self.due(result.step):
            return
        start = time.perf_counter()
        metrics = self.held_out.evaluate(engine)
        self.latest = {result.step: metrics}
        if engine.global_rank == 0:
            words = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
            print(f"hpctrain.train: step {result.step}: {words}", file=sys.stderr, flush=True)
            if self.journal is not None:
                self.journal.write(
                    "metrics", step=result.step, values={**metrics, EVAL_TIME: time.perf_counter() - start}
                )

    def at(self, step: int) -> dict[str, float]:
        """The metrics of the evaluation at ``step``; empty when the loop did not evaluate there."""
        return self.latest.get(step, {})
