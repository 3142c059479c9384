"""The loader's resume state: JSON-ready for checkpoint manifests, validated when read back."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hpctrain.errors import DataError

VERSION = 1
# The settings that, with seed and epoch, decide which samples a rank reads and in which order.
LAYOUT = ("dp_rank", "dp_size", "workers", "batch_size", "shuffle_buffer")


@dataclass(frozen=True)
class LoaderState:
    index: str  # ShardIndex.digest
    seed: int
    epoch: int
    dp_rank: int
    dp_size: int
    workers: int
    batch_size: int
    shuffle_buffer: int
    next_worker: int  # whose batch the training loop takes next
    positions: tuple[tuple[str | None, int], ...]  # per worker: shard it is in (None: finished), samples consumed there

    @property
    def layout(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in LAYOUT}

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["positions"] = [{"shard": shard, "offset": offset} for shard, offset in self.positions]
        return {"version": VERSION, **data}

    @classmethod
    def from_dict(cls, data: Any) -> LoaderState:
        """DataError naming the first problem when ``data`` is not a state this version wrote."""
        if not isinstance(data, dict) or data.get("version") != VERSION:
            raise DataError(f"loader state: expected a version {VERSION} ShardLoader state")
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name)
            if f.name == "positions":
                value = _positions(value)
            elif not isinstance(value, int if f.name != "index" else str) or isinstance(value, bool):
                raise DataError(f"loader state: {f.name!r} is missing or has the wrong type ({value!r})")
            values[f.name] = value
        state = cls(**values)
        if len(state.positions) != max(state.workers, 1) or not 0 <= state.next_worker < len(state.positions):
            raise DataError(
                f"loader state: {len(state.positions)} positions and next_worker {state.next_worker} "
                f"do not fit {state.workers} workers"
            )
        return state


def _positions(value: Any) -> tuple[tuple[str | None, int], ...]:
    problem = DataError(f"loader state: 'positions' must be a list of {{shard, offset}}, got {value!r}")
    try:
        out = tuple((p["shard"], p["offset"]) for p in value)
    except (TypeError, KeyError):
        raise problem from None
    for shard, offset in out:
        if not (shard is None or isinstance(shard, str)) or not isinstance(offset, int) or offset < 0:
            raise problem
    return out
