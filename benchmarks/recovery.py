"""From a crashed rank to the first resumed training step: restarted in the allocation (from the memory tier or
the file system) against requeued.

    scripts/dev-cluster up && .venv/bin/python benchmarks/recovery.py [--kills 3] [--lanes 24.11 26.05]

With --lanes, the same again on each Slurm lane (scripts/slurm-lane: the release in a tree of its own, with a dev
cluster of its own, started and stopped here), all in one table.

The reference trainer of benchmarks/preemption_resume.py (tiny GPT, 2 ranks tp=2 on one node, async
checkpoints every 20 steps to the job's checkpoint directory) has rank 1 SIGKILLed N times, 7, 12, 17...
steps past a save, in three ways:
  memory tier  retry.in_place = N and checkpoint.memory_every_steps = 5 (/dev/shm): restarted in place
               from the newest checkpoint of either tier
  in place     retry.in_place = N: the batch script starts the job step again in the same allocation,
               from the file system's checkpoint
  requeue      retry.on_error = true, no in-place restart: the run ends and the job goes back to Slurm's
               queue (the way every crash went before; the requeue delay is Slurm's, as preemption_resume
               explains: 10 s on the dev cluster, 120 s by default before 25.11)
Per kill, from the trainer's and the batch script's journal:
  to decision   the kill until the batch script has decided (journaled step_restart, or attempt_end)
  to main()     until the new ranks' trainer main() (srun, `hpctrain launch`, Python; Slurm's requeue
                delay and scheduling on the requeue way)
  to step       until the first resumed step (torch, gloo, engine, checkpoint load)
and the steps recomputed: the last step logged before the kill, less the checkpoint step resumed from.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.config import load_job_spec, load_site
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.slurm import SlurmClient
from hpctrain.submit import Submitter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from _figures import figure  # noqa: E402
from _preempt import wait  # noqa: E402
from preemption_resume import kinds, workspace, write_spec  # noqa: E402
from helpers.train import rank_pid  # noqa: E402

MEMORY_EVERY = 5
# Each right after the spec's [checkpoint] table.
WAYS = {"memory tier": f"memory_every_steps = {MEMORY_EVERY}\n[retry]\nin_place = {{kills}}\n",
        "in place": "[retry]\nin_place = {kills}\n", "requeue": "[retry]\non_error = true\n"}
ROWS = ("to decision", "to main()", "to step")


def run_way(work: Path, way: str, kills: int, index: Path) -> list[dict[str, float]]:
    """Kill rank 1 ``kills`` times in one job run ``way``; each kill's times and steps recomputed."""
    name = way.replace(" ", "-")
    spec_file = write_spec(work / f"{name}.toml", index, work / f"ckpt-{name}", WAYS[way].format(kills=kills))
    site = load_site("dev")
    client = SlurmClient.for_site(site)
    decided = "attempt_end" if way == "requeue" else "step_restart"
    out = []
    with Ledger(work / "ledger.db") as ledger:
        sub = Submitter(site, ledger, client).submit(load_job_spec(spec_file), spec_file)
        job = ledger.jobs.get(sub.ledger_ids[0])
        journal = Journal(Path(job["job_dir"]) / "journal")
        try:
            for k in range(kills):
                wait(lambda: len(kinds(journal, "startup")) == k + 1, 300, f"run {k} to start")
                # Past the next save (a requeue after no progress counts toward max_stalled_attempts), then
                # at a varying distance from it.
                target = kinds(journal, "startup")[-1]["resumed_from"] + 27 + 5 * k
                wait(lambda: any(r["step"] >= target for r in kinds(journal, "metrics")[-3:]), 300, "training")
                pid = wait(lambda: rank_pid(job["slurm_job_id"], 1), 30, "rank 1")
                last = kinds(journal, "metrics")[-1]["step"]
                killed_at = time.time()
                os.kill(pid, 9)
                startup = wait(lambda: kinds(journal, "startup")[k + 1:], 300, f"the run after kill {k + 1}")[0]
                decision = kinds(journal, decided)[k]
                out.append({"to decision": decision["time"] - killed_at,
                            "to main()": startup["times"]["main"] - decision["time"],
                            "to step": startup["times"]["first_step"] - startup["times"]["main"],
                            "recomputed": last - startup["resumed_from"], "tier": startup["tier"]})
        finally:
            client.scancel([job["slurm_job_id"]])
    return out


def in_lane(lane: str, kills: int) -> tuple[str, dict[str, list[dict[str, float]]]] | None:
    """This benchmark run on Slurm lane ``lane``'s own dev cluster: (its release, results); None when the lane's
    tree cannot be built here."""
    out = REPO / "benchmarks" / "results" / f"recovery-{lane}.json"
    out.parent.mkdir(exist_ok=True)
    inside = (f"scripts/dev-cluster up >/dev/null && .venv/bin/python benchmarks/recovery.py --kills {kills} "
              f"--json {out}; rc=$?; scripts/dev-cluster down >/dev/null; exit $rc")
    proc = subprocess.run([str(REPO / "scripts" / "slurm-lane"), lane, "run", "bash", "-c", inside], cwd=REPO)
    if proc.returncode == 77:
        print(f"lane {lane} skipped: its tree cannot be built here", file=sys.stderr)
        return None
    if proc.returncode != 0:
        raise SystemExit(f"recovery benchmark on Slurm lane {lane}: exit {proc.returncode}")
    data = json.loads(out.read_text())
    return data["version"], data["results"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--lanes", nargs="*", default=[], metavar="RELEASE",
                        help="also on these Slurm lanes (22.05, 24.11, 26.05 less the host's)")
    parser.add_argument("--json", type=Path, help="write this cluster's results here (a lane's run, for the table)")
    args = parser.parse_args()
    work, index = workspace("hpctrain-bench-recovery-")
    version = str(SlurmClient.for_site(load_site("dev")).version())
    runs = {version: {way: run_way(work, way, args.kills, index) for way in WAYS}}
    if args.json:
        args.json.write_text(json.dumps({"version": version, "results": runs[version]}))
        return
    for lane in args.lanes:
        if (found := in_lane(lane, args.kills)) is not None:
            runs[found[0]] = found[1]

    print(f"rank 1 SIGKILLed -> first resumed step, {args.kills} kills per way (tiny GPT, 2 ranks, CPU), median s")
    print(f"  {'Slurm':8}{'':14}" + "".join(f"{row:>13}" for row in ROWS) + f"{'total':>10}{'recomputed':>12}  resumed from")
    for release, results in runs.items():
        totals = {}
        for way, kills in results.items():
            totals[way] = statistics.median(sum(k[row] for row in ROWS) for k in kills)
            print(f"  {release:8}{way:14}" + "".join(f"{statistics.median(k[row] for k in kills):13.2f}" for row in ROWS)
                  + f"{totals[way]:10.2f}{max(k['recomputed'] for k in kills):12.0f}  "
                  + ", ".join(sorted({str(k["tier"]) for k in kills})))
        for way in ("memory tier", "in place"):
            print(f"  {release:8}{way} / requeue: {totals[way] / totals['requeue']:.2f}x")
        figure(f"rank killed -> first resumed step, in place from the memory tier (median, Slurm {release})",
               totals["memory tier"], "s", "<= 10 s (issue 19)", totals["memory tier"] <= 10)
        recomputed = max(k["recomputed"] for k in results["memory tier"])
        figure(f"steps recomputed per kill, memory tier (max, Slurm {release})", recomputed, "steps",
               f"<= memory_every_steps = {MEMORY_EVERY} (issue 19)", recomputed <= MEMORY_EVERY)
        for way in ("memory tier", "in place"):
            figure(f"rank killed -> first resumed step, {way} / requeued (median, Slurm {release})",
                   totals[way] / totals["requeue"], "x")


if __name__ == "__main__":
    main()
