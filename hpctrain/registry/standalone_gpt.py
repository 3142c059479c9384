"""The reference GPT in plain PyTorch, for a version that `hpctrain model export` wrote: the export copies this
file into its folder as ``modeling.py``, where it loads the weights without hpctrain.

    import sys; sys.path.insert(0, "/path/to/export")
    import modeling
    net = modeling.load("/path/to/export")          # nn.Sequential, in eval mode
    logits = net(torch.tensor([[72, 105, 33]]))     # (batch, seq, vocab)

It computes what ``hpctrain.train.model.gpt_sequential`` computes in one process, operation for operation, so the
logits are the same bit for bit. It imports torch (and safetensors for .safetensors weights) only.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

CONFIG = "config.json"
WEIGHTS = {"safetensors": "model.safetensors", "torch": "model.pt"}


class Embedding(nn.Module):
    def __init__(self, vocab: int, hidden: int, seq_len: int):
        super().__init__()
        self.tokens = nn.Parameter(torch.zeros(vocab, hidden))
        self.positions = nn.Parameter(torch.zeros(seq_len, hidden))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.tokens) + self.positions[: ids.shape[1]]


class ColumnLinear(nn.Module):
    """x A^T + b in one call (hpctrain's column-parallel layer on one rank)."""

    def __init__(self, inputs: int, outputs: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(outputs, inputs))
        self.bias = nn.Parameter(torch.zeros(outputs)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowLinear(nn.Module):
    """x A^T, then + b (hpctrain's row-parallel layer on one rank adds the bias after the reduction)."""

    def __init__(self, inputs: int, outputs: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(outputs, inputs))
        self.bias = nn.Parameter(torch.zeros(outputs))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight) + self.bias


class TransformerBlock(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv, self.proj = ColumnLinear(hidden, 3 * hidden), RowLinear(hidden, hidden)
        self.fc, self.out = ColumnLinear(hidden, 4 * hidden), RowLinear(4 * hidden, hidden)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv(x).view(batch, seq, self.heads, 3, self.head_dim)
        q, k, v = qkv.permute(3, 0, 2, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class LMHead(nn.Module):
    def __init__(self, hidden: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.proj = ColumnLinear(hidden, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.ln(x))


def build(layers: int, heads: int, hidden: int, vocab: int, seq_len: int) -> nn.Sequential:
    """The model's shape (config.json), with zero weights."""
    blocks = [TransformerBlock(hidden, heads) for _ in range(layers)]
    return nn.Sequential(Embedding(vocab, hidden, seq_len), *blocks, LMHead(hidden, vocab))


def load(folder: str | Path) -> nn.Sequential:
    """The model of an export folder with its weights, in eval mode."""
    folder = Path(folder)
    net = build(**json.loads((folder / CONFIG).read_text()))
    if (folder / WEIGHTS["safetensors"]).exists():
        from safetensors.torch import load_file

        weights = load_file(folder / WEIGHTS["safetensors"])
    else:
        weights = torch.load(folder / WEIGHTS["torch"], weights_only=True)
    net.load_state_dict(weights)
    return net.eval()
