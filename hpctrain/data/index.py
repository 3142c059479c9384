"""The shard index: which shards a dataset has, where they are, how many samples each holds, their checksums."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from hpctrain.data.source import is_url
from hpctrain.errors import DataError
from hpctrain.files import write_json_atomic

FORMAT = "hpctrain-shards/1"


@dataclass(frozen=True)
class ShardInfo:
    """One tar shard: the file ``name`` in the index's directory, or, given ``url`` (a ``pipe:`` command or an
    http(s) URL, see source), the bytes that gives; ``name`` then only identifies the shard, in loader
    states and quarantine records."""

    name: str
    samples: int
    bytes: int
    sha256: str
    url: str | None = None

    def content(self) -> dict[str, Any]:
        """What the shard holds, not where it is."""
        return {"name": self.name, "samples": self.samples, "bytes": self.bytes, "sha256": self.sha256}

    def to_json(self) -> dict[str, Any]:
        return self.content() if self.url is None else {**self.content(), "url": self.url}


@dataclass(frozen=True)
class ShardIndex:
    """The index file and the shards it lists, in packing order."""

    path: Path
    shards: tuple[ShardInfo, ...]

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def quarantine_dir(self) -> Path:
        """Where loaders record bad shards: one file per shard, next to the index."""
        return self.path.with_name(self.path.stem + ".quarantine")

    @cached_property
    def digest(self) -> str:
        """Identifies the content of the index: a loader state is only valid for the same digest. Locations
        are left out, so a state resumes over the same shards moved (to a server, or under new URLs)."""
        return hashlib.sha256(json.dumps([s.content() for s in self.shards]).encode()).hexdigest()[:16]

    def shard_path(self, shard: ShardInfo) -> Path:
        """Where a shard without a URL is."""
        return self.root / shard.name

    def location(self, shard: ShardInfo) -> str:
        """The shard's URL, or its path: what `source.open_shard` opens."""
        return shard.url or str(self.shard_path(shard))

    def write(self) -> None:
        write_json_atomic(self.path, {"format": FORMAT, "shards": [s.to_json() for s in self.shards]})


def load_index(path: str | Path) -> ShardIndex:
    """Read an index written by `pack` or `index_shards`; DataError naming the file when it is missing or malformed."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{path}: no such shard index") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable shard index ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a shard index (expected format {FORMAT!r})")
    return ShardIndex(path, tuple(_shard(path, i, entry) for i, entry in enumerate(data.get("shards", []))))


def _shard(path: Path, i: int, entry: Any) -> ShardInfo:
    try:
        shard = ShardInfo(**entry)
        valid = (
            isinstance(shard.name, str)
            and "/" not in shard.name
            and isinstance(shard.samples, int)
            and shard.samples >= 0
            and isinstance(shard.bytes, int)
            and isinstance(shard.sha256, str)
            and (shard.url is None or isinstance(shard.url, str) and is_url(shard.url))
        )
    except TypeError:
        valid = False
    if not valid:
        raise DataError(f"{path}: shard entry {i} is malformed: {entry!r}")
    return shard
