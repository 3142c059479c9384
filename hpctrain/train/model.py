"""The reference GPT: a list of pipeline layers, usable with DeepSpeed's PipelineModule or as one nn.Sequential.

Token and position embeddings, pre-LN transformer blocks (QKV column-parallel, attention output
row-parallel, MLP column -> row), a final LayerNorm and an untied LM head that is column-parallel
over the vocabulary with its logits gathered, so the loss is a plain cross-entropy. The embeddings
are replicated on every TP rank rather than vocab-parallel: for the small reference vocabulary a
vocab-parallel lookup would add a masked gather and an all-reduce per micro-batch to save little.

Every layer draws its initial weights from a generator seeded by (seed, layer index), full-size on
every rank, so any dp x tp x pp layout starts from exactly the weights of a single process.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from hpctrain.config.job import Model
from hpctrain.parallel.layers import INIT_STD, ColumnParallelLinear, RowParallelLinear, tp_size

Group = dist.ProcessGroup | None


def layer_generator(seed: int, index: int) -> torch.Generator:
    """A generator seeded from (seed, layer index) alone: the same on every rank and in every layout."""
    digest = hashlib.sha256(f"hpctrain-gpt/{seed}/{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


class Embedding(nn.Module):
    """Token ids (batch, seq) -> token + learned position embeddings (batch, seq, hidden)."""

    def __init__(self, model: Model, *, seed: int, index: int):
        super().__init__()
        g = layer_generator(seed, index)
        self.tokens = nn.Parameter(torch.empty(model.vocab, model.hidden).normal_(0.0, INIT_STD, generator=g))
        self.positions = nn.Parameter(torch.empty(model.seq_len, model.hidden).normal_(0.0, INIT_STD, generator=g))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.tokens) + self.positions[: ids.shape[1]]


class TransformerBlock(nn.Module):
    """Pre-LN block: x + attn(ln1(x)), then x + mlp(ln2(x)); heads and MLP columns split over ``group``."""

    def __init__(self, model: Model, *, seed: int, index: int, group: Group = None):
        super().__init__()
        g, h = layer_generator(seed, index), model.hidden
        if model.heads % tp_size(group):
            raise ValueError(f"heads = {model.heads} must be divisible by tp = {tp_size(group)}")
        self.local_heads, self.head_dim = model.heads // tp_size(group), h // model.heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        # QKV rows are head-major ([head][q|k|v][head_dim]) so a contiguous split keeps whole heads
        self.qkv = ColumnParallelLinear(h, 3 * h, generator=g, group=group)
        self.proj = RowParallelLinear(h, h, generator=g, group=group)
        self.fc = ColumnParallelLinear(h, 4 * h, generator=g, group=group)
        self.out = RowParallelLinear(4 * h, h, generator=g, group=group)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv(x).view(batch, seq, self.local_heads, 3, self.head_dim)
        q, k, v = qkv.permute(3, 0, 2, 1, 4)  # each (batch, heads, seq, head_dim)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, self.local_heads * self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class LMHead(nn.Module):
    """Final LayerNorm and the vocabulary projection -> logits (batch, seq, vocab), gathered over TP."""

    def __init__(self, model: Model, *, seed: int, index: int, group: Group = None):
        super().__init__()
        g = layer_generator(seed, index)
        if model.vocab % tp_size(group):
            raise ValueError(f"vocab = {model.vocab} must be divisible by tp = {tp_size(group)}")
        self.ln = nn.LayerNorm(model.hidden)
        self.proj = ColumnParallelLinear(
            model.hidden, model.vocab, generator=g, group=group, bias=False, gather_output=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position of the micro-batch."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def gpt_layers(model: Model, *, seed: int, group: Group = None) -> list[tuple[type[nn.Module], dict[str, Any]]]:
    """(layer class, constructor kwargs) in order; index i is the layer's global position."""
    classes = [Embedding, *[TransformerBlock] * model.layers, LMHead]
    return [
        (cls, {"model": model, "seed": seed, "index": i, **({} if cls is Embedding else {"group": group})})
        for i, cls in enumerate(classes)
    ]


def gpt_sequential(model: Model, *, seed: int, group: Group = None) -> nn.Sequential:
    """The whole model in one process (the single-process reference, or TP without pipelining)."""
    return nn.Sequential(*[cls(**kwargs) for cls, kwargs in gpt_layers(model, seed=seed, group=group)])
