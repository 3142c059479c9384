"""torch.distributed rendezvous from Slurm's environment (stdlib only: runs in every task)."""

from __future__ import annotations

import itertools
import re
import socket
from collections.abc import Callable, Mapping

from hpctrain.contract import JobEnvironment
from hpctrain.errors import HpctrainError


def expand_hostlist(expr: str) -> list[str]:
    """Host names of a Slurm hostlist, in the order `scontrol show hostnames` gives them.

    Comma-separated items; in each, every bracket holds numbers and ranges (zero padding as the lower
    bound's). With several brackets Slurm varies the last fastest, then the first, the second, ...:
    'rack[1-2]-n[01-02]' -> rack1-n01, rack1-n02, rack2-n01, rack2-n02; 'a[1-2]b[3-4]c[5-6]' -> a1b3c5,
    a1b3c6, a2b3c5, a2b3c6, a1b4c5, ...
    """
    hosts: list[str] = []
    for item in _items(expr):
        parts = re.split(r"\[([^\]]*)\]", item)  # text, bracket, text, ..., text (brackets balanced)
        texts, brackets = parts[::2], [_numbers(p, expr) for p in parts[1::2]]
        order = [*range(len(brackets) - 2, -1, -1), len(brackets) - 1] if brackets else []
        for picked in itertools.product(*(brackets[b] for b in order)):
            numbers = dict(zip(order, picked))
            hosts.append("".join(t + numbers.get(i, "") for i, t in enumerate(texts)))
    return hosts


def _items(expr: str) -> list[str]:
    """The comma-separated items of a hostlist, commas inside brackets left alone."""
    items, depth, start = [], 0, 0
    for i, c in enumerate(expr + ","):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if depth not in (0, 1):
            break
        if c == "," and depth == 0:
            items.append(expr[start:i].strip())
            start = i + 1
    if depth != 0:
        raise HpctrainError(f"hostlist {expr!r}: unbalanced brackets")
    return [item for item in items if item]


def _numbers(ranges: str, expr: str) -> list[str]:
    numbers = []
    for r in ranges.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", r)
        if not m or int(m[2] or m[1]) < int(m[1]):
            raise HpctrainError(f"hostlist {expr!r}: cannot read the range {r!r}")
        numbers += [f"{i:0{len(m[1])}d}" for i in range(int(m[1]), int(m[2] or m[1]) + 1)]
    return numbers


def tasks_on_node(tasks_per_node: str, node_index: int) -> int:
    """Slurm's '4(x2),3' (tasks per node, run-length coded) -> tasks on node ``node_index``."""
    counts: list[int] = []
    for item in tasks_per_node.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise HpctrainError(f"cannot parse SLURM_TASKS_PER_NODE={tasks_per_node!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts[node_index]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def master_port(
    env: Mapping[str, str], port_range: tuple[int, int], is_free: Callable[[int], bool] = port_is_free
) -> int:
    """A port derived from the job (and array task) id, moved on to the next free one in the range.

    Jobs sharing a node have different ids, hence different starting ports; a step restarted in the
    allocation starts further on, clear of the failed step's store (its port may linger in TIME_WAIT)."""
    lo, hi = port_range
    span = hi - lo + 1
    job = JobEnvironment(env)
    # Spread consecutive job ids, keep array tasks apart.
    start = (job.allocation_id * 131 + max(job.task_index, 0) + 7919 * job.step_restarts) % span
    for k in range(span):
        port = lo + (start + k) % span
        if is_free(port):
            return port
    raise HpctrainError(f"no free port in launch.master_port_range {lo}-{hi}")


def rendezvous_env(
    env: Mapping[str, str],
    port_range: tuple[int, int],
    is_free: Callable[[int], bool] = port_is_free,
    nodes: list[str] | None = None,
) -> dict[str, str]:
    """MASTER_ADDR (the first of the step's ``nodes``, by default of the allocation's) and MASTER_PORT, computed
    once per job step."""
    nodes = nodes or expand_hostlist(JobEnvironment(env).node_list)
    if not nodes:
        raise HpctrainError("SLURM_JOB_NODELIST is not set: `hpctrain launch` runs inside a Slurm allocation")
    return {"MASTER_ADDR": nodes[0], "MASTER_PORT": str(master_port(env, port_range, is_free))}


def task_env(env: Mapping[str, str]) -> dict[str, str]:
    """RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE of one srun task."""
    try:
        task = JobEnvironment(env).task_layout
    except KeyError as exc:
        raise HpctrainError(f"{exc.args[0]} is not set: run this inside an srun task") from None
    return {
        "RANK": str(task.rank),
        "LOCAL_RANK": str(task.local_rank),
        "WORLD_SIZE": str(task.world_size),
        "LOCAL_WORLD_SIZE": str(tasks_on_node(task.tasks_per_node, task.node_index)),
    }
