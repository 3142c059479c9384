"""DeepSpeed, imported without the tracker its autotuner would load.

``import deepspeed`` reaches ``deepspeed.autotuning.autotuner``, which imports mlflow (and with it pandas, fastapi
and more) wherever it is installed, as it is with hpctrain's ``[mlflow]`` extra: about 1 s of CPU at every rank's
start, also at an in-place restart. hpctrain never autotunes, so mlflow is hidden while DeepSpeed loads (the
autotuner records that it has none); ``import mlflow`` works as before afterwards. Import this module before any
``deepspeed`` submodule.
"""

from __future__ import annotations

import sys
from types import ModuleType

UNUSED_BY_DEEPSPEED = ("mlflow",)


def load() -> ModuleType:
    """``deepspeed``, imported now if it was not, with the modules of UNUSED_BY_DEEPSPEED hidden meanwhile."""
    hidden = [name for name in UNUSED_BY_DEEPSPEED if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # None in sys.modules: `import name` raises ImportError
    try:
        import deepspeed
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
    return deepspeed


deepspeed = load()
