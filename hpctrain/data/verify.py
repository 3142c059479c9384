"""Reading shards whole: checking them against their index (size, tar structure, sample count, sha256), and
indexing shards that already exist, local or behind URLs."""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import TypeVar
from urllib.parse import urlsplit

from hpctrain.data.index import ShardIndex, ShardInfo
from hpctrain.data.source import PIPE, is_url
from hpctrain.data.tarshard import scan
from hpctrain.errors import DataError

T = TypeVar("T")
R = TypeVar("R")


def verify_index(index: ShardIndex, *, jobs: int = 4) -> list[str]:
    """One line per bad or unreadable shard, naming its first problem; empty when every shard matches the index."""
    problems = _each(lambda shard: _problem(index, shard), index.shards, jobs)
    return [problem for problem in problems if problem]


def _problem(index: ShardIndex, shard: ShardInfo) -> str | None:
    location = index.location(shard)
    try:
        found = scan(location)
    except DataError as exc:
        return str(exc)
    if found.bytes != shard.bytes:
        problem = f"size {found.bytes} bytes, index says {shard.bytes}"
    elif found.problem:
        problem = found.problem
    elif found.samples != shard.samples:
        problem = f"{found.samples} samples, index says {shard.samples}"
    elif found.sha256 != shard.sha256:
        problem = f"sha256 {found.sha256}, index says {shard.sha256}"
    else:
        return None
    return f"{location}: {problem}"


def index_shards(path: Path, locations: Sequence[str], *, jobs: int = 4) -> ShardIndex:
    """Write the index ``path`` for existing tar shards, in the order given: files in the index's directory,
    ``pipe:`` commands or http(s) URLs. Each is read once, for its sample count, size and sha256."""
    names = _names(path, locations)
    shards = []
    for location, name, shard in zip(locations, names, _each(scan, locations, jobs)):
        if shard.samples is None:
            raise DataError(f"{location}: {shard.problem}")
        shards.append(ShardInfo(name, shard.samples, shard.bytes, shard.sha256, location if is_url(location) else None))
    index = ShardIndex(path, tuple(shards))
    path.parent.mkdir(parents=True, exist_ok=True)
    index.write()
    return index


def _each(function: Callable[[T], R], items: Sequence[T], jobs: int) -> list[R]:
    with ThreadPoolExecutor(jobs) as pool:  # hashing and reads release the GIL: parallel reads help on Lustre
        return list(pool.map(function, items))


def _names(path: Path, locations: Sequence[str]) -> list[str]:
    """Shard names, which loader states and quarantine records use: the file name each location ends with,
    for a pipe: command the last word naming a .tar ('pipe:curl -s https://host/d/a.tar' -> 'a.tar')."""
    names: dict[str, str] = {}
    for location in locations:
        if not is_url(location):
            if Path(location).resolve().parent != path.resolve().parent:
                raise DataError(f"{location}: a local shard must be in the index's directory, {path.parent}")
            name = Path(location).name
        elif location.startswith(PIPE):
            words = [PurePosixPath(urlsplit(w).path).name for w in shlex.split(location.removeprefix(PIPE))]
            name = next((w for w in reversed(words) if ".tar" in w), "")
        else:
            name = PurePosixPath(urlsplit(location).path).name
        if not name:
            raise DataError(f"{location}: no file name to name the shard by (a pipe: command's words name no .tar)")
        if name in names:
            raise DataError(f"{location}: the same file name as {names[name]}; shards are named by their file names")
        names[name] = location
    return list(names)
