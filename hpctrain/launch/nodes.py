"""Which of the allocation's nodes a job step runs on, and which it leaves out (spare nodes, failed nodes).

A job with restarts in the allocation (retry.in_place) is allocated with --no-kill: a node that fails leaves
the job instead of ending it, though SLURM_JOB_NODELIST still names it. Each (re)started step runs on the first
``resources.nodes`` of the nodes Slurm still holds for the job that are healthy (not down, drained, failing or
silent) and that hpctrain has not excluded (a node whose ranks were the first to fail in two steps of this run,
the spec's ``retry.exclude_node_after``); of a job of several shapes (``resources.nodes = [4, 2]``), on the largest
shape those nodes hold: the rest wait as spares. With too few such nodes the step cannot keep its layout: the run
ends and is requeued without the nodes left out (see ``hpctrain attempt``).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from hpctrain.contract import JobEnvironment
from hpctrain.launch.rendezvous import expand_hostlist
from hpctrain.ledger.journal import Journal
from hpctrain.slurm.client import SlurmClient

# sinfo's long state names (%T) of a node no step should start on; a trailing '*' means it does not respond.
_UNHEALTHY = ("down", "drained", "fail", "failing", "future", "unknown", "inval")
# How long a step waits for nodes that only miss the controller's pings (a loaded node) before leaving them out.
SILENT_WAIT_S = 20.0
SILENT_POLL_S = 2.0


@dataclass(frozen=True)
class StepNodes:
    """The nodes a step runs on, and every other node of the allocation with why it is not used."""

    wanted: int
    chosen: list[str]
    left_out: dict[str, str] = field(default_factory=dict)

    @property
    def enough(self) -> bool:
        return len(self.chosen) == self.wanted

    def lost(self) -> dict[str, str]:
        """The nodes left out for a reason other than being a spare."""
        return {n: why for n, why in self.left_out.items() if why != "spare"}

    def describe(self) -> str:
        lost = self.lost()
        text = f"on {','.join(self.chosen) or 'no node'}"
        if lost:
            text += "; left out: " + ", ".join(f"{n} ({why})" for n, why in lost.items())
        if not self.enough:
            text += f"; {len(self.chosen)} healthy nodes of the {self.wanted} the step needs"
        return text


def unhealthy(state: str) -> bool:
    """Whether sinfo's long state of a node (``allocated``, ``mixed*``, ``down``, ``drained``...) rules it out."""
    return state.endswith("*") or state.rstrip("*~#!%$@^-").startswith(_UNHEALTHY)


def choose(
    allocated: list[str],
    held: Iterable[str],
    states: dict[str, str],
    excluded: dict[str, str],
    wanted: int | Sequence[int],
) -> StepNodes:
    """The first ``wanted`` usable nodes of ``allocated`` (the allocation's nodes in Slurm's order, the batch
    host first): those Slurm still ``held`` for the job, healthy in ``states``, not ``excluded`` (node: why). Of
    several counts (a job's shapes), the largest the usable nodes hold, else the smallest."""
    held = set(held)
    usable: list[str] = []
    left_out: dict[str, str] = {}
    for node in allocated:
        state = states.get(node, "")
        if node not in held:
            left_out[node] = "Slurm took it out of the allocation"
        elif unhealthy(state):
            left_out[node] = f"Slurm says {state}"
        elif node in excluded:
            left_out[node] = excluded[node]
        else:
            usable.append(node)
    counts = sorted([wanted] if isinstance(wanted, int) else wanted, reverse=True)
    want = next((n for n in counts if n <= len(usable)), counts[-1])
    left_out.update({node: "spare" for node in usable[want:]})
    return StepNodes(want, usable[:want], {n: left_out[n] for n in allocated if n in left_out})


def excluded_nodes(journal: Journal | None, env: JobEnvironment, after: int) -> dict[str, str]:
    """Nodes this run leaves out after its failed steps: each ``rank_failed`` record (hpctrain.launch.task) names
    the node of the rank that failed first, on its own, in one step; a step that hung (a ``hang`` record) blames
    no node, whatever failed in it. A node named in ``after`` steps is out (0: none is)."""
    failed: dict[int, str] = {}
    hung: set[int] = set()
    for _, rec in journal.records(kinds=("rank_failed", "hang")) if journal is not None else ():
        if rec.get("attempt") != env.run_number or rec.get("task_index", -1) != env.task_index:
            continue
        step = rec.get("step_restart", 0)
        if rec["kind"] == "hang":
            hung.add(step)
        else:
            failed.setdefault(step, rec["host"])
    steps = Counter(node for step, node in failed.items() if step not in hung)
    return {node: f"its ranks failed first in {n} steps" for node, n in steps.items() if after and n >= after}


def silent_only(state: str) -> bool:
    """Whether a node is ruled out only for not answering the controller's pings (``mixed*``): a busy node
    answers again, a dead one goes down."""
    return state.endswith("*") and not unhealthy(state.rstrip("*"))


def step_nodes(
    client: SlurmClient,
    wanted: int | Sequence[int],
    env: JobEnvironment | None = None,
    silent_wait_s: float = SILENT_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    exclude_after: int = 2,
) -> StepNodes:
    """`choose` for this run's next job step, from what the controller says (one `scontrol show job`, `sinfo`)
    and this run's journal (a node whose ranks failed first in ``exclude_after`` steps is out). When too few
    nodes are left only because some do not answer the controller's pings, `sinfo` is asked again for up to
    ``silent_wait_s`` seconds before the step gives them up (or runs on a smaller of ``wanted``'s shapes)."""
    env = env or JobEnvironment()
    nodes = expand_hostlist(env.node_list)
    held = expand_hostlist(client.show_job(env.slurm_job_id or "").get("NodeList", ""))
    excluded = excluded_nodes(Journal.from_env(), env, exclude_after)
    checks = int(silent_wait_s // SILENT_POLL_S)
    counts = [wanted] if isinstance(wanted, int) else list(wanted)
    best = max((n for n in counts if n <= len(nodes)), default=min(counts))  # what a healthy allocation holds
    for check in range(checks + 1):
        states = client.node_states(nodes)
        got = choose(nodes, held, states, excluded, counts)
        full = got.enough and got.wanted == best
        if full or check == checks or not any(silent_only(states.get(n, "")) for n in got.lost()):
            break
        sleep(SILENT_POLL_S)
    return got
