"""Placement by predicted start (issue 63) on a replayed trace: the same 200 jobs of mixed sizes submitted to each
job's own partition, then with `submit --soonest`, on the live dev cluster under background load, in one run.

    scripts/dev-cluster up && .venv/bin/python benchmarks/placement_replay.py [--jobs 200] [--gap 1.0] [--seed 1]

The cluster as a busy site's: partition gpu narrowed to one node (n3, 4 GPUs), where another team (user bob,
account teamb) has queued six 4-GPU jobs of 60 s (six minutes of the node) under limits of 10 minutes; partition
debug (n1, n2) gets two such jobs of 30 s. The trace: jobs of 1, 2 or 4 GPUs (half, a third, a sixth) sleeping 1-4 s under a time limit of 5 minutes (as
most jobs end well before their limit), arriving every ``gap`` seconds on average (exponential), each spec naming
partition gpu and account teama. Arm "own partition": each job submitted as its spec says (`hpctrain submit`).
Arm "soonest": each job ranked afresh (`hpctrain where`: one `sbatch --test-only` a partition) and submitted to the
first candidate (`submit --soonest`). Each arm starts from a fresh ledger and the same background, and ends once
every job of it has ended; the ledger is refreshed every 10 s meanwhile, as `status --watch` would, so the
soonest arm learns from the waits of the jobs it placed before.

Reported: each arm's median and 90th-percentile wait (Slurm's Start - Submit); the goal: the 90th percentile
halved. For the soonest arm, the prediction's mean absolute error against the actual start, beside that of Slurm's
estimate alone (`sbatch --test-only`), both from the placement events `hpctrain where` learns from. Partition gpu
is put back and every job cancelled at the end, also on error.
"""

from __future__ import annotations

import argparse
import getpass
import random
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _figures import figure

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.jobs.poll import Poller
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit import Submitter
from hpctrain.submit.soonest import chosen, rank

USER = getpass.getuser()
POLL_S = 10.0  # `hpctrain status --watch`'s interval
GPU_NODES = "n[1-3]"


def slurm(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip()


def trace(jobs: int, gap: float, seed: int) -> list[tuple[float, int, int]]:
    """(seconds after the previous arrival, GPUs, seconds of sleep) per job."""
    rng = random.Random(seed)
    return [(rng.expovariate(1 / gap), rng.choices((1, 2, 4), (3, 2, 1))[0], rng.randint(1, 4)) for _ in range(jobs)]


@contextmanager
def background(queued: dict[str, int], seconds: dict[str, int]) -> Iterator[None]:
    """Another team's load: user bob in account teamb queues ``queued[p]`` 4-GPU jobs in each partition p, each
    sleeping ``seconds[p]`` under a time limit of 10 minutes, one after another (teamb may run 8 GPUs: a node of
    each); cancelled at the end."""
    try:
        for partition, count in queued.items():
            for _ in range(count):
                slurm(
                    "runuser",
                    "-u",
                    "bob",
                    "--",
                    "sbatch",
                    "--parsable",
                    "-o",
                    "/dev/null",
                    "-p",
                    partition,
                    "-A",
                    "teamb",
                    "-N",
                    "1",
                    "--gres=gpu:4",
                    "-t",
                    "10",
                    "--mem=100M",
                    "--wrap",
                    f"sleep {seconds[partition]}",
                )
        yield
    finally:
        subprocess.run(["scancel", "-u", "bob"], capture_output=True)


def spec_of(k: int, gpus: int, seconds: int) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": f"replay-{k}",
            "command": ["sleep", str(seconds)],
            "launcher": "none",
            "resources": {
                "gpus_per_node": gpus,
                "tasks_per_node": 1,
                "cpus_per_task": 1,
                "mem": "100M",
                "time": "00:05:00",
                "partition": "gpu",
                "account": "teama",
            },
        }
    )


def run_arm(soonest: bool, jobs: list[tuple[float, int, int]], folder: Path) -> tuple[list[float], Path]:
    """Submit the trace as the arm does; every job's wait (s) once all have ended, and the arm's ledger."""
    site, client = load_site("dev"), SlurmClient()
    path = folder / f"{'soonest' if soonest else 'own'}.db"
    ledger = Ledger(path)
    slurm_ids = []
    poller, polled = Poller(ledger, client, site.name), time.monotonic()
    with background({"gpu": 6, "debug": 2}, {"gpu": 60, "debug": 30}), ledger:
        time.sleep(5)  # the background in place first
        for k, (gap, gpus, seconds) in enumerate(jobs):
            time.sleep(gap)
            if time.monotonic() - polled > POLL_S:  # the starts reach the ledger as `status --watch` brings them
                poller.refresh()
                polled = time.monotonic()
            spec, placement = spec_of(k, gpus, seconds), None
            if soonest:
                placement = chosen(rank(spec, site, client, USER, f"<replay {k}>", ledger, fresh=True), spec.name)
                spec.resources = spec.resources.model_copy(
                    update={"partition": placement.partition, "account": placement.account}
                )
            slurm_ids += Submitter(site, ledger, client).submit(spec, f"<replay {k}>", placement=placement).slurm_ids
        while slurm("squeue", "-h", "-u", USER, "-j", ",".join(slurm_ids), "-o", "%i"):
            time.sleep(2)
        poller.refresh()
    rows = slurm("sacct", "-X", "-n", "-P", "-o", "JobID,Submit,Start", "-j", ",".join(slurm_ids)).splitlines()
    waits = []
    for row in rows:
        _, submit, start = row.split("|")
        waits.append(_epoch(start) - _epoch(submit))
    return waits, path


def _epoch(text: str) -> float:
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap", type=float, default=1.0, help="mean seconds between arrivals")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    jobs = trace(args.jobs, args.gap, args.seed)
    slurm("scontrol", "update", "PartitionName=gpu", "Nodes=n3")
    try:
        with tempfile.TemporaryDirectory(prefix="hpctrain-replay-") as tmp:
            own, _ = run_arm(False, jobs, Path(tmp))
            fast, path = run_arm(True, jobs, Path(tmp))
            with Ledger(path) as ledger:
                errors = ledger.events.start_errors("dev", 0.0)
                placed = Counter(j["partition"] for j in ledger.jobs.of_site("dev"))
    finally:
        subprocess.run(["scancel", "-u", "bob"], capture_output=True)
        slurm("scontrol", "update", "PartitionName=gpu", f"Nodes={GPU_NODES}")
    print(
        f"{args.jobs} jobs (1/2/4 GPUs, 1-4 s), one every {args.gap:g} s on average, under background load; "
        f"--soonest placed them: {', '.join(f'{n} in {p}' for p, n in placed.most_common())}"
    )
    for name, waits in (("own partition", own), ("soonest", fast)):
        print(
            f"  {name:14} wait median {statistics.median(waits):7.1f} s   p90 {p90(waits):7.1f} s   "
            f"max {max(waits):7.1f} s"
        )
    figure("replay: wait p90, own partition", p90(own), "s")
    figure(
        "replay: wait p90, --soonest",
        p90(fast),
        "s",
        "<= half the own partition's (issue 63)",
        p90(fast) <= p90(own) / 2,
    )
    figure("replay: wait median, own partition", statistics.median(own), "s")
    figure("replay: wait median, --soonest", statistics.median(fast), "s")
    predicted = statistics.fmean(abs(p) for p, _ in errors)
    slurm_alone = statistics.fmean(abs(s) for _, s in errors)
    print(
        f"  prediction's mean absolute error over {len(errors)} starts: {predicted:.1f} s "
        f"(Slurm's estimate alone: {slurm_alone:.1f} s)"
    )
    figure("replay: prediction error (mean absolute)", predicted, "s")
    figure("replay: Slurm's estimate alone, error (mean absolute)", slurm_alone, "s")


if __name__ == "__main__":
    main()
