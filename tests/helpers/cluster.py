"""The dev cluster and Slurm's commands: the cluster's script, a job spec that preempts whatever runs in QOS low,
sacct's own GPU-hours, waiting for a job to finish, Slurm's hostlist forms, and PATH shims that log (or block) every
Slurm command hpctrain runs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from helpers.paths import REPO
from helpers.waiting import wait_until

if TYPE_CHECKING:
    from hpctrain.ledger import Ledger

DEV_CLUSTER = REPO / "scripts" / "dev-cluster"
# Port bases of the dev clusters beside the configured one (the host's 16800, each lane's 17800, 19800 or 20800,
# 1,000 or more apart). A cluster uses base +6 .. +203 sparsely (see scripts/dev-cluster): pytest-xdist worker gwK's
# is at the configured base + K x WORKER_PORT_STEP (30 apart, up to 9 workers stay clear of each other), the second
# cluster of tests/cluster/test_dev_cluster.py at +500, the short share's (`--cluster-share short`) at +750, and its
# second worker's 30 above that, below the next lane's.
WORKER_PORT_STEP = 30
SECOND_CLUSTER_PORT_OFFSET = 500
SHORT_SHARE_PORT_OFFSET = 750
# A job spec taking every GPU of the dev cluster's three nodes in QOS high: whatever runs in QOS low is preempted.
HIGH = {"name": "urgent", "command": ["sleep", "2"], "launcher": "none",
        "resources": {"nodes": 3, "gpus_per_node": 4, "tasks_per_node": 1, "mem": "1G", "time": "5",
                      "qos": "high", "account": "teama"}}


@contextmanager
def slurm_setting(key: str, value: str) -> Iterator[None]:
    """The running dev cluster (this worker's) with ``key = value`` in its slurm.conf meanwhile: written, and read
    again by slurmctld and the slurmds (`scontrol reconfigure`); put back after."""
    conf = Path(os.environ["SLURM_CONF"])
    before = conf.read_text()
    line = re.compile(rf"^{key}=.*$", re.M)
    assert line.search(before), f"{key} is not set in {conf}"

    def apply(text: str, want: str) -> None:
        conf.write_text(text)
        subprocess.run(["scontrol", "reconfigure"], check=True, capture_output=True)
        wait_until(lambda: re.search(rf"^{key}\s*=\s*{want}\b", subprocess.run(
            ["scontrol", "show", "config"], capture_output=True, text=True).stdout, re.M), 60, 0.5,
            f"slurmctld to read {key}={want}")

    apply(line.sub(f"{key}={value}", before), value.split()[0])
    try:
        yield
    finally:
        apply(before, line.search(before)[0].split("=", 1)[1].split()[0])


@contextmanager
def qos_setting(qos: str, **values: str) -> Iterator[None]:
    """The running dev cluster (this worker's) with QOS ``qos`` set to ``values`` (sacctmgr's names:
    PreemptMode=cancel, GraceTime=0) meanwhile, once slurmctld has them (its association manager's copy, which it
    preempts by); put back after."""
    names = ",".join(values)
    shown = subprocess.run(["sacctmgr", "-n", "-P", "show", "qos", qos, f"format={names}"], check=True,
                           capture_output=True, text=True).stdout.strip().split("|")
    # Times as sacctmgr shows them (00:00:20) it reads back as something else: given back in seconds.
    before = [str(sum(int(x) * 60**i for i, x in enumerate(reversed(v.split(":"))))) if re.fullmatch(r"\d+:\d\d:\d\d", v)
              else v for v in shown]

    def apply(settings: dict[str, str]) -> None:
        subprocess.run(["sacctmgr", "-i", "modify", "qos", "where", f"name={qos}", "set",
                        *(f"{k}={v}" for k, v in settings.items())], check=True, capture_output=True)
        if "PreemptMode" in settings:
            want = f"PreemptMode={settings['PreemptMode'].upper()}"
            wait_until(lambda: want in subprocess.run(["scontrol", "show", "assoc_mgr", "flags=qos", f"qos={qos}"],
                                                      capture_output=True, text=True).stdout, 30, 0.5,
                       f"slurmctld to read QOS {qos}'s {want}")

    apply(values)
    try:
        yield
    finally:
        apply(dict(zip(values, before)))


def dev_root(environ: dict[str, str]) -> str:
    """The configured dev cluster's root (scripts/dev-cluster's default unless HPCTRAIN_DEV_ROOT)."""
    return environ.get("HPCTRAIN_DEV_ROOT", "/var/tmp/hpctrain-dev")


def dev_port_base(environ: dict[str, str] | None = None) -> int:
    """The configured dev cluster's port base (scripts/dev-cluster's default unless HPCTRAIN_DEV_PORT_BASE)."""
    return int((os.environ if environ is None else environ).get("HPCTRAIN_DEV_PORT_BASE", "16800"))


def worker_cluster(worker: str | None, environ: dict[str, str]) -> dict[str, str]:
    """The dev cluster settings of a pytest-xdist worker (PYTEST_XDIST_WORKER): gw0, or no worker, uses the
    configured cluster (the host's, or the lane's); gwK (K > 0) a cluster of its own beside it, its root and port
    base derived from the configured ones, so that workers never share a controller, a queue or a QOS."""
    if not worker or worker == "gw0":
        return {}
    k = int(worker.removeprefix("gw"))
    base = dev_port_base(environ) + k * WORKER_PORT_STEP
    return {"HPCTRAIN_DEV_ROOT": f"{dev_root(environ)}-{worker}", "HPCTRAIN_DEV_PORT_BASE": str(base)}


def short_share_cluster(environ: dict[str, str]) -> dict[str, str]:
    """The dev cluster settings of the session that runs the short cluster tests (`--cluster-share short`) beside
    the long ones: a cluster of its own, its root and port base derived from the configured ones."""
    return {"HPCTRAIN_DEV_ROOT": f"{dev_root(environ)}-short",
            "HPCTRAIN_DEV_PORT_BASE": str(dev_port_base(environ) + SHORT_SHARE_PORT_OFFSET)}


def site_with_cache(path: Path, cache_dir: str, extra: str = "") -> str:
    """The dev site at ``path`` with a `[cache]` in ``cache_dir`` (expanded on each node: a folder per node, as the
    dev cluster's nodes share one host) and ``extra`` settings of it; its path, for `load_site` and `--site`."""
    path.write_text((REPO / "site_configs" / "dev.toml").read_text() + f'\n[cache]\ndir = "{cache_dir}"\n{extra}')
    return str(path)


# A race's runner: one GPU, one CPU, writing its ledger id into the file {ran}: which runner ran the command.
RACER = """name = "racer"
command = ["python3", "-c", "import os; open({ran!r}, 'a').write(os.environ['HPCTRAIN_JOB_ID'] + chr(10))"]
launcher = "none"
[resources]
gpus_per_node = 1
cpus_per_task = 1
mem = "1G"
time = "00:05:00"
account = "teama"
"""


def sacct_said(slurm_id: str) -> str:
    """sacct's rows of a job, as text: what a failed assertion on its runs shows."""
    return subprocess.run(["sacct", "-X", "-D", "-P", "-o", "JobID,State,Submit,Start,End,NodeList,AllocTRES", "-j",
                           slurm_id], capture_output=True, text=True).stdout


def run_ends(*causes: str) -> list[list[str]]:
    """The ways a job's runs may end when they end as ``causes``: so, or on a release that runs a job once more after
    a preempted run outlived its grace time (24.11: `reruns_after_preemption`, as a loaded machine's stop checkpoint
    may), so and then Slurm's own rerun, which hpctrain's batch script ends at once (cause rerun)."""
    from hpctrain.slurm import SlurmClient

    ends = [list(causes)]
    if "preemption" in causes and SlurmClient().version().reruns_after_preemption:
        ends.append([*causes, "rerun"])
    return ends


def sacct_gpu_hours(slurm_id: str) -> float:
    """sacct's own numbers: every run of the job, GPUs x ElapsedRaw."""
    out = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-o", "ElapsedRaw,AllocTRES", "-j", slurm_id],
                         capture_output=True, text=True, check=True).stdout
    total = 0.0
    for line in out.splitlines():
        elapsed, tres = line.split("|")
        gpus = dict(t.split("=") for t in tres.split(",") if "=" in t).get("gres/gpu", "0")
        total += int(elapsed) * int(gpus) / 3600
    return total


def finish(ledger: Ledger, job_id: int, timeout: float = 180, supervise: bool = False) -> str:
    """Poll (or reconcile, which also requeues dead runs) until the job is finished; its final state."""
    from hpctrain.config import load_site
    from hpctrain.jobs.poll import Poller
    from hpctrain.jobs.reconcile import reconcile
    from hpctrain.slurm import SlurmClient
    from hpctrain.slurm.states import TERMINAL

    client = SlurmClient.for_site(load_site("dev"))
    poller = Poller(ledger, client, "dev")

    def done():
        reconcile(ledger, client, "dev") if supervise else poller.refresh()
        return ledger.jobs.get(job_id)["state"] in TERMINAL

    wait_until(done, timeout, 2.0, f"job {job_id} to finish")
    return ledger.jobs.get(job_id)["state"]


# Every form `scontrol show hostnames` accepts (tests/unit/launch/test_launch.py expands them, and
# tests/cluster/test_launch_cluster.py compares that with scontrol's expansion).
HOSTLISTS = ["n[1-3,7],gpu[08-10],login1", "rack[1-2]-n[01-02]", "r[1,3]c[2-3]s[9-10],x1", "a[1-2]b[3-4]c[5-6]d[7-8]",
             "n[098-101]", "n[01-2]", "n[1-02]", "n[9-10]", "login1,login2", "gpu[7]", "a1-ib[2-3]"]

SHIMMED = ("sbatch", "sacct", "squeue", "sacctmgr", "sshare", "scontrol", "scancel", "sinfo")

SlurmLog = tuple[dict[str, str], Callable[[], Counter]]


def slurm_shims(directory: Path, passthrough: tuple[str, ...] = ()) -> SlurmLog:
    """(env, counts()): PATH stubs that log every Slurm command; those not in ``passthrough`` fail without
    running, so that input wrongly accepted can never submit a job."""
    log = directory / "calls.log"
    directory.mkdir(exist_ok=True)
    for cmd in SHIMMED:
        run = f'exec {shutil.which(cmd)} "$@"' if cmd in passthrough else f'echo "{cmd}: blocked by the test" >&2; exit 1'
        stub = directory / cmd
        stub.write_text(f'#!/bin/bash\necho {cmd} >> {log}\n{run}\n')
        stub.chmod(0o755)

    def counts() -> Counter:
        return Counter(log.read_text().split()) if log.exists() else Counter()

    return {"PATH": f"{directory}:{os.environ['PATH']}"}, counts
