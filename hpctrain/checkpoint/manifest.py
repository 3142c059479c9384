"""manifest.json: merged from the ranks' fragments at commit, validated when read.

The manifest is the checkpoint's only source of truth: which tensors exist, their shapes and dtypes,
which rank wrote each chunk and the chunk's CRC32C, plus per-rank state trees, data-loader cursors
and RNG states. A directory without a valid manifest is never trusted.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from hpctrain.checkpoint.format import TensorMeta
from hpctrain.checkpoint.naming import MANIFEST
from hpctrain.errors import CheckpointError

FORMAT = "hpctrain.checkpoint"
VERSION = 1


class NewerFormatError(CheckpointError):
    """A checkpoint written by a newer hpctrain: not corrupt, so never skipped, replaced or deleted."""


@dataclass(frozen=True)
class ChunkRecord:
    rank: int
    crc32c: int


@dataclass(frozen=True)
class TensorEntry:
    name: str
    meta: TensorMeta
    chunks: dict[tuple[int, ...], ChunkRecord]


def merge(fragments: list[dict[str, Any]], header: dict[str, Any]) -> dict[str, Any]:
    """The manifest of one checkpoint from every rank's fragment; raises if the ranks disagree or left gaps."""
    world = header["world_size"]
    ranks = sorted(f["rank"] for f in fragments)
    if ranks != list(range(world)):
        raise CheckpointError(f"step {header['step']}: fragments from ranks {ranks}, expected 0..{world - 1}")
    tensors: dict[str, dict[str, Any]] = {}
    for frag in sorted(fragments, key=lambda f: f["rank"]):
        for name, t in frag["tensors"].items():
            meta = TensorMeta.from_json(t)
            entry = tensors.setdefault(name, {**meta.to_json(), "chunk_records": {}})
            if TensorMeta.from_json(entry) != meta:
                raise CheckpointError(
                    f"tensor {name!r}: rank {frag['rank']} wrote {meta}, another rank {TensorMeta.from_json(entry)}"
                )
            for chunk in t["chunks_written"]:
                index = tuple(chunk["index"])
                if index in entry["chunk_records"]:
                    other = entry["chunk_records"][index]["rank"]
                    raise CheckpointError(f"tensor {name!r}: chunk {index} written by ranks {other} and {frag['rank']}")
                entry["chunk_records"][index] = {"index": list(index), "rank": frag["rank"], "crc32c": chunk["crc32c"]}
    for name, entry in tensors.items():
        meta = TensorMeta.from_json(entry)
        missing = math.prod(meta.grid) - len(entry["chunk_records"])
        if missing:
            raise CheckpointError(
                f"tensor {name!r}: {missing} of {math.prod(meta.grid)} chunks written by no rank "
                "(a shard passed with write=False on every rank that holds it?)"
            )
        entry["chunk_records"] = sorted(entry["chunk_records"].values(), key=lambda c: c["index"])
    per_rank = {str(f["rank"]): {k: v for k, v in f.items() if k not in ("tensors", "rank")} for f in fragments}
    for frag in fragments:
        per_rank[str(frag["rank"])]["wrote"] = sorted(frag["tensors"])
    return {"format": FORMAT, "version": VERSION, **header, "tensors": dict(sorted(tensors.items())), "ranks": per_rank}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Manifest:
    """A checkpoint's parsed manifest; ``path`` is the checkpoint directory."""

    path: Path
    data: dict[str, Any]

    @classmethod
    def read(cls, ckpt: Path) -> Manifest:
        file = ckpt / MANIFEST
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{ckpt}: no {MANIFEST} (incomplete or damaged checkpoint, not trusted)") from None
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{file}: unreadable: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CheckpointError(f"{file}: not an hpctrain checkpoint manifest")
        version = data.get("version")
        if version != VERSION:
            newer = isinstance(version, int) and version > VERSION
            raise (NewerFormatError if newer else CheckpointError)(
                f"{file}: format version {version}, this hpctrain reads {VERSION}"
            )
        manifest = cls(ckpt, data)
        try:
            manifest._check()
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{file}: malformed ({type(exc).__name__}: {exc})") from None
        return manifest

    def _check(self) -> None:
        """Parse everything now, so that a bad manifest fails here rather than in the middle of a load."""
        if self.step < 0 or not self.ranks:
            raise ValueError("no step or no ranks")
        for e in self.tensors.values():
            if set(e.chunks) != set(itertools.product(*map(range, e.meta.grid))):
                raise ValueError(f"tensor {e.name!r}: its chunk records do not match its chunk grid")

    @property
    def step(self) -> int:
        return int(self.data["step"])

    @cached_property
    def ranks(self) -> dict[int, dict[str, Any]]:
        return {int(r): v for r, v in self.data["ranks"].items()}

    @cached_property
    def tensors(self) -> dict[str, TensorEntry]:
        return {
            name: TensorEntry(
                name,
                TensorMeta.from_json(t),
                {tuple(c["index"]): ChunkRecord(c["rank"], c["crc32c"]) for c in t["chunk_records"]},
            )
            for name, t in self.data["tensors"].items()
        }

    def tensor(self, name: str) -> TensorEntry:
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.path}: no tensor {name!r} in this checkpoint") from None

    def rank_state(self, rank: int) -> dict[str, Any]:
        try:
            return self.ranks[rank]
        except KeyError:
            raise CheckpointError(
                f"{self.path}: written by {len(self.ranks)} ranks, has no rank {rank}; "
                "pass like= to load into another layout"
            ) from None

    @property
    def stored_bytes(self) -> int:
        return sum(e.meta.chunk_file_bytes * len(e.chunks) for e in self.tensors.values())
