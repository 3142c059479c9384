"""The reference trainer's optimizer: torch's AdamW, the same arithmetic and state, without importing torch._dynamo.

torch 2.13 wraps ``Optimizer.step`` in graph breaks and ``add_param_group``, ``zero_grad``, ``state_dict`` and
``load_state_dict`` in ``torch._disable_dynamo``: each imports ``torch._dynamo`` at its first call, about 1 CPU-second
at every rank's start (a quarter of the start's CPU; again at each in-place restart) for a compiler this trainer never
runs. ``AdamW`` calls the functions torch wraps, ``step`` in the grad mode torch's wrapper sets. (With ZeRO or bf16,
DeepSpeed's optimizer imports it anyway: it looks for its Muon optimizer, which compiles a function at import.)
tests/unit/train/test_train_optimizer.py checks it against torch's own AdamW bit for bit, without ``torch._dynamo``;
test_train_parallel's restore scenario, that a rank trains, saves and resumes without it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

# The functions torch wraps (inspect.unwrap also goes through the step hooks torch adds to a class it instantiated).
_STEP = inspect.unwrap(torch.optim.AdamW.step)
_ADD_PARAM_GROUP = inspect.unwrap(torch.optim.Optimizer.add_param_group)
_ZERO_GRAD = inspect.unwrap(torch.optim.Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.load_state_dict)


class AdamW(torch.optim.AdamW):
    """``torch.optim.AdamW`` whose methods run eagerly, never through torch._dynamo (hooks and profiling as torch's:
    torch wraps this class's ``step`` with them when it is first instantiated)."""

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        with torch.set_grad_enabled(self.defaults["differentiable"]):
            return _STEP(self, closure)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)
