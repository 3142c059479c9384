"""A shard source of fixed pace that says each time it is read: `pipe:python -m helpers.slow_source FILE LOG RATE`
writes FILE to stdout at RATE bytes a second, after appending its name, node (Slurm's, else the host's) and Slurm job
to LOG (O_APPEND: one line each, whole, however many nodes append at once). The data-cache tests count the source's
reads by LOG."""

from __future__ import annotations

import os
import shlex
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path

from hpctrain.data.index import ShardIndex

from helpers.paths import TESTS


def slow_index(index: ShardIndex, path: Path, log: Path, rate: float | None) -> ShardIndex:
    """``index``'s shards behind this source, in a new index at ``path``; ``rate`` None: as fast as `cat`, logged by
    the shell (no Python started for each read)."""
    python, helpers, logged = shlex.quote(sys.executable), shlex.quote(str(TESTS)), shlex.quote(str(log))

    def url(shard) -> str:
        file = shlex.quote(str(index.shard_path(shard)))
        if rate is None:
            node = '"${SLURMD_NODENAME:-$(hostname)}" "${SLURM_JOB_ID:--}"'
            return f"pipe:printf '%s %s %s\\n' {shlex.quote(shard.name)} {node} >> {logged} && exec cat {file}"
        return f"pipe:PYTHONPATH={helpers} {python} -m helpers.slow_source {file} {logged} {rate:g}"

    shards = tuple(replace(s, url=url(s)) for s in index.shards)
    slow = ShardIndex(path, shards)
    path.parent.mkdir(parents=True, exist_ok=True)
    slow.write()
    return slow


def reads(log: Path, besides: str | None = None) -> list[tuple[str, str]]:
    """(shard file name, node) of each read so far, but those of Slurm job ``besides`` (a job cancelled midway can
    start a read as it dies, which then logs after the job has left squeue)."""
    if not log.exists():
        return []
    lines = (line.split(" ") for line in log.read_text().splitlines())
    return [(name, node) for name, node, job in lines if job != besides]


def main(file: str, log: str, rate: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()  # the dev cluster's nodes share one host
    os.write(fd, f"{Path(file).name} {node} {os.environ.get('SLURM_JOB_ID', '-')}\n".encode())
    os.close(fd)
    per_s, chunk = float(rate), 64 << 10
    start, sent = time.monotonic(), 0
    with open(file, "rb") as src:
        while data := src.read(chunk):
            sys.stdout.buffer.write(data)
            sent += len(data)
            time.sleep(max(0.0, start + sent / per_s - time.monotonic()))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main(*sys.argv[1:4])
