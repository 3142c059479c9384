"""WebDataset shards: packing, verification, and a deterministic, exactly resumable loader per DP rank.

Heavy dependencies (torch, webdataset) load on first use of the loader or packer, so importing this
package, or `hpctrain.cli.data`, stays cheap.
"""

from __future__ import annotations

from hpctrain.lazy import lazy_exports

_EXPORTS = {
    "ShardIndex": "index",
    "ShardInfo": "index",
    "load_index": "index",
    "pack": "packing",
    "pack_npy_dir": "packing",
    "verify_index": "verify",
    "index_shards": "verify",
    "ShardLoader": "loader",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
