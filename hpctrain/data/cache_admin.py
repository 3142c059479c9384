"""What `hpctrain cache` does to a node's shard cache (hpctrain.data.cache): list its copies, hash each again, clear
those no process uses; each answer a JSON-ready dict naming the node and the directory."""

from __future__ import annotations

from typing import Any

from hpctrain.contract import JobEnvironment
from hpctrain.data.cache import ShardCache

ACTIONS = ("ls", "verify", "clear")


def act(shards: ShardCache, action: str) -> dict[str, Any]:
    """``action`` (of ACTIONS) on ``shards``."""
    copies = shards.copies()
    # Slurm's name of the node (the dev cluster's nodes share one host), else the host's
    found: dict[str, Any] = {"host": JobEnvironment().node, "dir": str(shards.dir)}
    if action == "ls":
        found["copies"] = [c.__dict__ for c in copies]
    elif action == "verify":
        checked = [shards.verify(c.sha256) for c in copies]
        found.update(verified=sum(c is True for c in checked), corrupt=sum(c is False for c in checked))
    elif action == "clear":
        removed = [c for c in copies if shards.evict(c.sha256)]
        found.update(removed=len(removed), bytes=sum(c.bytes for c in removed), in_use=len(copies) - len(removed))
    else:
        raise ValueError(f"cache action {action!r}: not one of {', '.join(ACTIONS)}")
    return found
