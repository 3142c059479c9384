"""WebDataset shards: packing, verification, and a deterministic, exactly resumable loader per DP rank.

Heavy dependencies (torch, webdataset) load on first use of the loader or packer, so importing this
package, or `hpctrain.data.cli`, stays cheap.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ShardIndex": "hpctrain.data.index", "ShardInfo": "hpctrain.data.index", "load_index": "hpctrain.data.index",
    "pack": "hpctrain.data.packing", "pack_npy_dir": "hpctrain.data.packing", "verify_index": "hpctrain.data.verify",
    "ShardLoader": "hpctrain.data.loader",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
