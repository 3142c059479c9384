"""Nested training state (dicts, lists, tuples of tensors and JSON values) <-> named leaves and a skeleton."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hpctrain.checkpoint.format import is_tensor
from hpctrain.errors import CheckpointError

_COMPONENT = re.compile(r"^[A-Za-z0-9_+=,@-][A-Za-z0-9_.+=,@-]*$")
_SCALARS = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Shard:
    """This rank's slice of a tensor: ``data`` sits at ``offset`` inside a tensor of ``global_shape``.

    Shards of one tensor form a regular grid: ``chunks`` is the grid's cell (default ``data.shape``;
    pass it on an edge shard that is smaller than the others). ``write=False`` marks a replica of a
    slice that another rank writes (e.g. a tensor-parallel slice on data-parallel peers).
    """

    data: Any
    global_shape: tuple[int, ...]
    offset: tuple[int, ...]
    chunks: tuple[int, ...] | None = None
    write: bool = True

    @property
    def box(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(self.offset), tuple(self.data.shape)


def flatten(tree: Mapping[str, Any]) -> tuple[dict[str, Any], Any]:
    """(leaves by '/'-joined path, JSON skeleton); leaves are tensors, Shards and JSON scalars."""
    if not isinstance(tree, Mapping):
        raise CheckpointError(f"checkpoint state must be a mapping, not {type(tree).__name__}")
    leaves: dict[str, Any] = {}
    return leaves, _walk(tree, (), leaves)


# A module-level function, not a closure: a nested function that calls itself is a reference cycle
# (function -> its cell -> function) that would keep ``leaves``, a whole state's tensors, alive until
# the cyclic garbage collector runs, which may be never once the cycle reaches the oldest generation.
def _walk(node: Any, path: tuple[str, ...], leaves: dict[str, Any]) -> Any:
    name = "/".join(path)
    if isinstance(node, Shard):
        leaves[name] = node
        return {"leaf": "shard", "path": name, "offset": list(node.offset), "shape": list(node.data.shape)}
    if is_tensor(node):
        leaves[name] = node
        return {"leaf": "tensor", "path": name}
    if isinstance(node, Mapping):
        items = []
        for key, child in node.items():
            if isinstance(key, bool) or not isinstance(key, (str, int)) or not _COMPONENT.match(str(key)):
                raise CheckpointError(
                    f"state key {key!r} at {name or '<root>'!r}: use str or int keys of "
                    "letters, digits and _.+=,@- (not starting with '.')"
                )
            items.append([key, _walk(child, (*path, str(key)), leaves)])
        return {"dict": items}
    if isinstance(node, (list, tuple)):
        kind = "tuple" if isinstance(node, tuple) else "list"
        return {kind: [_walk(child, (*path, str(i)), leaves) for i, child in enumerate(node)]}
    value = node.item() if isinstance(node, np.generic) else node
    if not isinstance(value, _SCALARS):
        raise CheckpointError(
            f"state value at {name!r} has type {type(node).__name__}: "
            "only tensors, Shards, dicts, lists, tuples and JSON scalars can be saved"
        )
    leaves[name] = value
    return {"leaf": "value", "path": name, "value": value}


def unflatten(skeleton: Any, leaf: Callable[[dict[str, Any]], Any]) -> Any:
    """Rebuild the tree; ``leaf(node)`` gives the value of each leaf node (see ``flatten``)."""
    if "dict" in skeleton:
        return {key: unflatten(child, leaf) for key, child in skeleton["dict"]}
    if "list" in skeleton:
        return [unflatten(child, leaf) for child in skeleton["list"]]
    if "tuple" in skeleton:
        return tuple(unflatten(child, leaf) for child in skeleton["tuple"])
    return leaf(skeleton)


def leaf_nodes(skeleton: Any) -> dict[str, dict[str, Any]]:
    """The skeleton's leaf nodes by path."""
    found: dict[str, dict[str, Any]] = {}
    unflatten(skeleton, lambda node: found.setdefault(node["path"], node))
    return found


def plain_values(skeleton: Any) -> dict[str, Any]:
    """The skeleton's JSON values (not tensors) by path."""
    return {path: node["value"] for path, node in leaf_nodes(skeleton).items() if node["leaf"] == "value"}
