"""`hpctrain launch`: inside an allocation, set up rendezvous and network, then srun one task per slot."""

from __future__ import annotations

import os
import shlex
import sys
from typing import Mapping, Sequence

from hpctrain.config.site import SiteConfig
from hpctrain.contract import JobEnvironment
from hpctrain.launch.rendezvous import rendezvous_env
from hpctrain.ledger.journal import Journal


def launch_env(site: SiteConfig, env: Mapping[str, str]) -> dict[str, str]:
    """Variables every task needs: rendezvous, then the site's NCCL/InfiniBand settings
    (a value already set in the job's environment wins, so a user can override one)."""
    out = rendezvous_env(env, site.launch.master_port_range)
    out.update({k: env.get(k, v) for k, v in site.network_env.items()})
    return out


def srun_argv(command: list[str], python: str = sys.executable, srun_options: Sequence[str] = (),
              inside: Sequence[str] = ()) -> list[str]:
    """srun starts the allocation's tasks (one per GPU, or per slot on CPU); each runs the task shim, under
    ``inside`` (a container's `apptainer exec ... IMAGE`; pyxis comes as ``srun_options``). Each line of the log
    starts with its task's rank ("3: "), for `hpctrain logs --rank`."""
    return ["srun", *srun_options, "--kill-on-bad-exit=1", "--label", *inside, python, "-m", "hpctrain.launch.task",
            "--", *command]


def launch(site: SiteConfig, command: list[str], dry_run: bool = False, python: str = sys.executable,
           srun_options: Sequence[str] = (), inside: Sequence[str] = ()) -> None:
    """Record the launch environment in the job's journal, then exec srun (signals then reach srun directly)."""
    extra = launch_env(site, os.environ)
    argv = srun_argv(command, python, srun_options, inside)
    network = {k: extra[k] for k in site.network_env}
    summary = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"hpctrain launch: {summary}", file=sys.stderr)
    if dry_run:
        print(shlex.join(argv))
        return
    journal = Journal.from_env()
    if journal is not None:
        journal.write("launch", message=f"{extra['MASTER_ADDR']}:{extra['MASTER_PORT']}",
                      nodes=JobEnvironment().node_list, ntasks=JobEnvironment().ntasks,
                      master_addr=extra["MASTER_ADDR"], master_port=extra["MASTER_PORT"], network_env=network)
    os.execvpe(argv[0], argv, {**os.environ, **extra})
