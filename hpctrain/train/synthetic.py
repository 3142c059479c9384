"""Deterministic synthetic token data: sample i depends only on (seed, i).

Each sample is an arithmetic progression modulo the vocabulary with a random start and stride,
so a model can learn it (the loss falls) and every layout sees exactly the same tokens.
Step s uses samples [s*G, (s+1)*G) with G = micro_batch * grad_accum * dp; data-parallel rank r
takes the r-th contiguous run of micro_batch * grad_accum of them, in micro-batches. Another source of
samples with the same signature as ``samples`` (e.g. text) can be batched the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from itertools import count

import torch

from hpctrain.config.job import Model, Parallel

Batch = tuple[torch.Tensor, torch.Tensor]
Source = Callable[[Model, int, int, int], Batch]  # (model, seed, first, n) -> samples first .. first+n-1


def samples(model: Model, seed: int, first: int, n: int) -> Batch:
    """(input_ids, labels), each (n, seq_len) int64, for samples first .. first+n-1."""
    rows = []
    for i in range(first, first + n):
        g = torch.Generator().manual_seed(seed * 1_000_003 + i)
        start, stride = torch.randint(0, model.vocab, (2,), generator=g).tolist()
        rows.append((start + stride * torch.arange(model.seq_len + 1)) % model.vocab)
    tokens = torch.stack(rows)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def global_batch(model: Model, parallel: Parallel, seed: int, step: int, source: Source = samples) -> Batch:
    """Every sample of one optimizer step (what a single process trains on)."""
    size = parallel.samples_per_step
    return source(model, seed, step * size, size)


def micro_batches(
    model: Model, parallel: Parallel, seed: int, dp_rank: int, start_step: int = 0, source: Source = samples
) -> Generator[Batch, None, None]:
    """Endless micro-batches of one data-parallel rank, from optimizer step ``start_step`` on."""
    per_rank = parallel.micro_batch * parallel.grad_accum
    for step in count(start_step):
        first = step * parallel.samples_per_step + dp_rank * per_rank
        for k in range(parallel.grad_accum):
            yield source(model, seed, first + k * parallel.micro_batch, parallel.micro_batch)
