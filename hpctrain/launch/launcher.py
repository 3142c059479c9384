"""`hpctrain launch`: inside an allocation, set up rendezvous and network, then srun one task per slot."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from hpctrain.config.site import SiteConfig
from hpctrain.contract import JobEnvironment
from hpctrain.errors import HpctrainError
from hpctrain.launch.nodes import StepNodes, step_nodes
from hpctrain.launch.rendezvous import rendezvous_env, tasks_on_node
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.attempts import RunPolicy
from hpctrain.slurm.client import SlurmClient


def launch_env(site: SiteConfig, env: Mapping[str, str], nodes: list[str] | None = None) -> dict[str, str]:
    """Variables every task needs: rendezvous on the step's ``nodes`` (default: the allocation's), then the site's
    NCCL/InfiniBand settings (a value already set in the job's environment wins, so a user can override one)."""
    out = rendezvous_env(env, site.launch.master_port_range, nodes=nodes)
    out.update({k: env.get(k, v) for k, v in site.network_env.items()})
    return out


def srun_argv(
    command: list[str], python: str = sys.executable, srun_options: Sequence[str] = (), inside: Sequence[str] = ()
) -> list[str]:
    """srun starts the allocation's tasks (one per GPU, or per slot on CPU); each runs the task shim, under
    ``inside`` (a container's `apptainer exec ... IMAGE`; pyxis comes as ``srun_options``). Each line of the log
    starts with its task's rank ("3: "), for `hpctrain logs --rank`."""
    return [
        "srun",
        *srun_options,
        "--kill-on-bad-exit=1",
        "--label",
        "--",
        *inside,
        python,
        "-m",
        "hpctrain.launch.task",
        "--",
        *command,
    ]


def placement_options(step: StepNodes, per_node: int) -> list[str]:
    """srun options that run ``per_node`` tasks on each of ``step.chosen``."""
    return [
        f"--nodes={len(step.chosen)}",
        f"--ntasks={len(step.chosen) * per_node}",
        f"--ntasks-per-node={per_node}",
        f"--nodelist={','.join(step.chosen)}",
    ]


def launch(
    site: SiteConfig,
    command: list[str],
    dry_run: bool = False,
    python: str = sys.executable,
    srun_options: Sequence[str] = (),
    inside: Sequence[str] = (),
    nodes: Sequence[int] = (),
) -> None:
    """Record the launch environment in the job's journal, then exec srun (signals then reach srun directly).
    With ``nodes``, the step runs on that many of the allocation's healthy nodes, or of several counts (a job's
    shapes) on the largest they hold (`hpctrain.launch.nodes`)."""
    job = JobEnvironment()
    step, ntasks = None, job.ntasks
    if nodes:
        policy = RunPolicy.of_job(job)
        step = step_nodes(SlurmClient.for_site(site), nodes, job, exclude_after=policy.exclude_node_after)
        if not step.enough:
            raise HpctrainError(f"cannot start the job step: {step.describe()}")
        # The spec's: a job of shapes asks its tasks as CPUs (hpctrain.submit.render), Slurm's count follows those.
        per_node = policy.tasks_per_node or tasks_on_node(job.tasks_per_node, 0)
        srun_options, ntasks = [*placement_options(step, per_node), *srun_options], str(step.wanted * per_node)
    extra = launch_env(site, os.environ, step.chosen if step else None)
    argv = srun_argv(command, python, srun_options, inside)
    network = {k: extra[k] for k in site.network_env}
    summary = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"hpctrain launch: {summary}" + (f" {step.describe()}" if step else ""), file=sys.stderr)
    if dry_run:
        print(shlex.join(argv))
        return
    journal = Journal.from_env()
    if journal is not None:
        journal.write(
            "launch",
            message=f"{extra['MASTER_ADDR']}:{extra['MASTER_PORT']}",
            nodes=",".join(step.chosen) if step else job.node_list,
            ntasks=ntasks,
            left_out=step.lost() if step else {},
            master_addr=extra["MASTER_ADDR"],
            master_port=extra["MASTER_PORT"],
            network_env=network,
        )
    os.execvpe(argv[0], argv, {**os.environ, **extra})
