"""The dev clusters that CI runs side by side (scripts/test) never share a port nor a job id: the host's and each
lane's, their xdist workers', the short share's and test_dev_cluster's second cluster."""

from __future__ import annotations

import itertools
import re

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
    for (a, base_a), (b, base_b) in itertools.combinations(bases.items(), 2):
        assert not _ports(base_a) & _ports(base_b), f"{a} ({base_a}) and {b} ({base_b}) share ports"
        assert base_a % 10000 != base_b % 10000, f"{a} and {b} number their jobs alike (scripts/dev-cluster)"
