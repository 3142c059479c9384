"""A continuation of a prompt (greedy, or drawn at a temperature) by the reference GPT from its newest checkpoint, in one CPU process.

Byte-level: the prompt's UTF-8 bytes are the tokens (``model.vocab`` must be 256, as for the shards of
``hpctrain data text``), and the continuation is decoded back to text. Only the ``model.*`` tensors are
read; they are stored whole (assembled from every tp/pp rank's pieces), so any layout samples alike.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from hpctrain.checkpoint import latest_valid, load_flat
from hpctrain.checkpoint.manifest import Manifest
from hpctrain.checkpoint.naming import task_dir
from hpctrain.config.job import JobSpec, Model
from hpctrain.errors import CheckpointError, ConfigError
from hpctrain.train.model import gpt_sequential

BYTE_VOCAB = 256
PREFIX = "model."


def newest_checkpoint(spec: JobSpec, task: int = -1) -> Path:
    """The newest valid checkpoint of the spec's checkpoint directory (an array task's own, given ``task``)."""
    if spec.checkpoint.dir is None:
        raise ConfigError(f"{spec.name}: the spec has no checkpoint.dir to sample from")
    directory = task_dir(spec.checkpoint.dir, task)
    found = latest_valid(directory)
    if found is None:
        raise CheckpointError(f"{directory}: no committed checkpoint yet")
    return found


def load_model(model: Model, ckpt: Path) -> nn.Sequential:
    """The reference GPT with the weights of ``ckpt`` (checksums verified on read), in eval mode."""
    names = [n for n in Manifest.read(ckpt).tensors if n.startswith(PREFIX)]
    if not names:
        raise CheckpointError(f"{ckpt}: no {PREFIX}* tensors (not a reference-GPT checkpoint)")
    net = gpt_sequential(model, seed=0)
    try:
        net.load_state_dict({n.removeprefix(PREFIX): t for n, t in load_flat(ckpt, names).items()})
    except RuntimeError as exc:  # shapes or names of another [model]
        raise CheckpointError(f"{ckpt}: does not fit the spec's [model]: {str(exc).splitlines()[-1].strip()}") from None
    return net.eval()


@torch.no_grad()
def continuation(
    net: nn.Module, prompt: bytes, new_tokens: int, window: int, temperature: float = 0.0, seed: int = 0
) -> bytes:
    """``prompt`` followed by ``new_tokens`` bytes, each predicted from the last ``window``: the most likely one
    (greedy) at temperature 0, else drawn from the softmax of the logits / ``temperature`` (seeded, so
    repeatable); a small model's greedy text soon loops, a draw at 0.5-0.8 reads more like its data."""
    ids = list(prompt) or [ord("\n")]
    draws = torch.Generator().manual_seed(seed)
    for _ in range(new_tokens):
        logits = net(torch.tensor([ids[-window:]]))[0, -1]
        if temperature > 0:
            ids.append(int(torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=draws)))
        else:
            ids.append(int(logits.argmax()))
    return bytes(ids)


def sample(
    spec: JobSpec,
    prompt: str,
    new_tokens: int,
    ckpt: Path | None = None,
    task: int = -1,
    temperature: float = 0.0,
    seed: int = 0,
) -> tuple[Path, str]:
    """(the checkpoint used, the prompt and its continuation as text)."""
    model = spec.model or Model()
    if model.vocab != BYTE_VOCAB:
        raise ConfigError(f"model.vocab = {model.vocab}: sampling decodes bytes, which needs vocab = {BYTE_VOCAB}")
    ckpt = ckpt or newest_checkpoint(spec, task)
    text = continuation(load_model(model, ckpt), prompt.encode(), new_tokens, model.seq_len, temperature, seed)
    return ckpt, text.decode(errors="replace")
