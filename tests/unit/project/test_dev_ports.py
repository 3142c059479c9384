"""The dev clusters that CI runs side by side (scripts/test) never share a port nor a job id: the host's and each
lane's, their xdist workers', the short share's and test_dev_cluster's second cluster. Nor do their jobs race for
one MASTER_PORT: the dev site's port range is clear of the clusters' own ports, and their k-th jobs start apart."""

from __future__ import annotations

import itertools
import re
import subprocess

from hpctrain.config import load_site
from hpctrain.launch.rendezvous import master_port

from helpers.cluster import DEV_CLUSTER, SECOND_CLUSTER_PORT_OFFSET, dev_port_base, short_share_cluster, worker_cluster
from helpers.paths import REPO


def _ports(base: int) -> set[int]:
    """The ports scripts/dev-cluster gives a cluster at ``base``: its daemons' and the range of its slurmds'."""
    text = DEV_CLUSTER.read_text()
    single = {int(n) for n in re.findall(r"_PORT=\$\(\(BASE \+ (\d+)\)\)", text)}  # slurmctld's, slurmdbd's, MariaDB's
    low, high = map(int, re.search(r'SLURMD_PORTS="\$\(\(BASE \+ (\d+)\)\)-\$\(\(BASE \+ (\d+)\)\)"', text).groups())
    assert len(single) == 3
    return {base + n for n in (*single, *range(low, high + 1))}


def _bases() -> dict[str, int]:
    """Each Slurm's configured port base: the host's default and each lane's (scripts/slurm-lane)."""
    lanes = re.findall(r"LANE=(\d+\.\d+) SUITE=\w+ PORT_BASE=(\d+)", (REPO / "scripts" / "slurm-lane").read_text())
    assert len(lanes) == 3, lanes
    return {"host": dev_port_base({}), **{lane: int(base) for lane, base in lanes}}


def test_every_cluster_of_a_ci_run_has_its_own_ports_and_job_ids():
    bases: dict[str, int] = {}
    for name, base in _bases().items():
        env = {"HPCTRAIN_DEV_ROOT": f"/var/tmp/{name}", "HPCTRAIN_DEV_PORT_BASE": str(base)}
        for share, configured in (("long", env), ("short", {**env, **short_share_cluster(env)})):
            for worker in ("gw0", "gw1"):  # scripts/test's two workers
                bases[f"{name} {share} {worker}"] = int({**configured, **worker_cluster(worker, configured)}[
                    "HPCTRAIN_DEV_PORT_BASE"])
        bases[f"{name} second"] = base + SECOND_CLUSTER_PORT_OFFSET
    port_range = load_site("dev").launch.master_port_range
    first = _first_job_ids(bases.values())
    for (a, base_a), (b, base_b) in itertools.combinations(bases.items(), 2):
        assert not _ports(base_a) & _ports(base_b), f"{a} ({base_a}) and {b} ({base_b}) share ports"
        assert abs(first[base_a] - first[base_b]) >= 9000, f"{a} and {b} number their jobs alike (scripts/dev-cluster)"
        # The k-th jobs of two clusters (their tests run in one order) start 4 ports apart or more: a launch that
        # finds its port taken moves on to the next ones.
        for k in range(LOCKSTEP_JOBS):
            ports = [master_port({"SLURM_JOB_ID": str(first[base] + k)}, port_range, lambda _: True)
                     for base in (base_a, base_b)]
            assert abs(ports[0] - ports[1]) >= 4, f"{a} and {b}: job {k} of each starts at port {ports}"
    assert not {p for base in bases.values() for p in _ports(base)} & set(range(port_range[0], port_range[1] + 1))


# How many jobs two clusters running the same tests stay in step for, at most (their first ids 26 apart: mod 9,000).
LOCKSTEP_JOBS = 20


def _first_job_ids(bases) -> dict[int, int]:
    """Each base's first job id, by scripts/dev-cluster's own arithmetic."""
    expr = re.search(r"^FIRST_JOB_ID=\$\(\((.+)\)\)$", DEV_CLUSTER.read_text(), re.M)[1]
    script = "".join(f"BASE={base}; echo $(({expr}));" for base in bases)
    ids = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(bases, map(int, ids)))
