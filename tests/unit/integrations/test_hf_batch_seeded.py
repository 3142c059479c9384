"""hpctrain's BatchSeeded collator: a batch's random draws (masking) come from the batch itself, whatever the
process's random state, which it leaves as it was; the draws of torch, NumPy and Python alike."""

import random

import numpy as np
import torch

from hpctrain.integrations.hf import BatchSeeded


def draws(features):
    """A collator drawing from every global generator, as masking collators do."""
    ids = torch.stack([f["input_ids"] for f in features])
    return ids, torch.rand(ids.shape), np.random.rand(3), random.random()


def same(a, b) -> bool:
    return torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) and np.array_equal(a[2], b[2]) and a[3] == b[3]


def batch(seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 256, (16,), generator=g)} for _ in range(4)]


def test_a_batch_draws_the_same_in_any_random_state_and_leaves_that_state_alone():
    collate = BatchSeeded(draws, seed=3)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    first = collate(batch(0))
    after = torch.rand(1), np.random.rand(), random.random()
    torch.manual_seed(2), np.random.seed(2), random.seed(2)  # another worker, a resumed run: another state
    again = collate(batch(0))
    assert same(first, again)
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    assert (torch.rand(1), np.random.rand(), random.random()) == after  # as if the collator had drawn nothing
    assert not same(first, collate(batch(1)))  # another batch, other draws
    assert not same(first, BatchSeeded(draws, seed=4)(batch(0)))  # another seed too
