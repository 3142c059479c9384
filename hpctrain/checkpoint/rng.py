"""Capture and restore the global RNG states (python, numpy, torch CPU and CUDA) as JSON.

Only libraries the process has already imported are captured: one not imported has not been drawn from.
"""

from __future__ import annotations

import base64
import random
import sys
from typing import Any


def _b64(t: Any) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode("ascii")


def _byte_tensor(s: str) -> Any:
    import torch

    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)


def capture_rng_state() -> dict[str, Any]:
    """This process's RNG states, JSON-serialisable."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss]}
    np = sys.modules.get("numpy")
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        state["numpy"] = [name, keys.tolist(), pos, has_gauss, cached]
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = _b64(torch.get_rng_state())
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set the RNG states captured by ``capture_rng_state``."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state:
        import torch

        torch.set_rng_state(_byte_tensor(state["torch"]))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([_byte_tensor(s) for s in state["cuda"]])
