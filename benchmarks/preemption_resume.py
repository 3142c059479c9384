"""From the preemption signal to the first resumed training step, split into its parts.

    scripts/dev-cluster up && .venv/bin/python benchmarks/preemption_resume.py [--preemptions 3]
    scripts/slurm-lane 26.05 run bash -c 'HPCTRAIN_DEV_REQUEUE_DELAY=2 scripts/dev-cluster up &&
                                          .venv/bin/python benchmarks/preemption_resume.py'

The reference trainer (tiny GPT, 2 ranks tp=2 on one node, async checkpoints every 20 steps) runs in
QOS low and is preempted by a high job N times. Per preemption, from the trainer's journal and sacct:
  notice->step   signal received until every rank agreed at a step boundary
  checkpoint     making that step durable (completing the async save in flight, or a sync save)
  requeue delay  Slurm: the run's end until the job is eligible again: AuthInfo's cred_expire before
                 25.11 (10 s on the dev cluster, 120 s by default), SchedulerParameters' requeue_delay
                 from 25.11 (HPCTRAIN_DEV_REQUEUE_DELAY), as `hpctrain doctor` reports it
  scheduling     Slurm: eligible until started
  start-up       Slurm start until the trainer's main() (batch script, srun, `hpctrain launch`, Python)
                 plus main() until the engine is built (torch, gloo, DeepSpeed)
  load           the newest valid checkpoint into model, optimizer, RNG and data cursor
  first step     the first resumed step
hpctrain's part is everything but the two Slurm rows. Goal: at most 5 s, and 0 steps lost. The
figures name the Slurm release: run it on each lane to compare them.
Slurm timestamps have 1 s resolution. The machine has 2 cores: torch start-up dominates here.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from hpctrain.config import load_job_spec, load_site
from hpctrain.config.job import JobSpec, Model
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.parse import parse_parsable_with_header
from hpctrain.slurm.sacct import parse_time
from hpctrain.submit import Submitter
from hpctrain.train.dataset import pack_token_dataset

from _figures import figure
from _preempt import HIGH, wait

MODEL = {"layers": 4, "heads": 4, "hidden": 64, "vocab": 256, "seq_len": 32}
SPEC = """\
name = "bench-preempt"
command = ["python", "-m", "hpctrain.train", "--steps", "100000"]
seed = 5

[resources]
gpus_per_node = 2
mem = "3G"
time = "00:30:00"
preemptible = true
account = "teama"

[parallel]
tp = 2
micro_batch = 2
grad_accum = 2

[model]
{model}

[data]
index = "{index}"
workers = 1

[checkpoint]
dir = "{ckpt}"
every_steps = 20
"""
ROWS = ("notice->step", "checkpoint", "requeue delay", "scheduling", "start-up: to main()", "start-up: engine",
        "load", "first step")
SLURM_ROWS = {"requeue delay", "scheduling"}


def kinds(journal: Journal, kind: str) -> list[dict]:
    return [r for _, r in journal.records(kinds=[kind])]


def split(requeue: dict, startup: dict, old_run: dict, new_run: dict) -> dict[str, float]:
    t = startup["times"]
    eligible, start = parse_time(new_run["Eligible"]), parse_time(new_run["Start"])
    return {
        "notice->step": requeue["stopped_at"] - requeue["signal_at"],
        "checkpoint": requeue["checkpoint_s"],
        "requeue delay": eligible - parse_time(old_run["End"]),
        "scheduling": start - eligible,
        "start-up: to main()": t["main"] - start,
        "start-up: engine": t["engine"] - t["main"],
        "load": t["loaded"] - t["engine"],
        "first step": t["first_step"] - t["loaded"],
    }


def workspace(prefix: str) -> tuple[Path, Path]:
    """A fresh folder with a ledger of its own (HPCTRAIN_LEDGER) and the token dataset: (folder, its index)."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.environ["HPCTRAIN_LEDGER"] = str(work / "ledger.db")
    return work, pack_token_dataset(work / "data", Model(**MODEL), seed=3, count=2000, shard_bytes=16384).path


def write_spec(path: Path, index: Path, ckpt: Path, extra: str = "") -> Path:
    """The reference trainer's spec (SPEC), with ``extra`` TOML after it."""
    path.write_text(SPEC.format(model="\n".join(f"{k} = {v}" for k, v in MODEL.items()), index=index, ckpt=ckpt)
                    + extra)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preemptions", type=int, default=3)
    args = parser.parse_args()
    work, index = workspace("hpctrain-bench-preempt-")
    spec_file = write_spec(work / "spec.toml", index, work / "ckpt")
    site = load_site("dev")
    client = SlurmClient.for_site(site)
    features = client.features()
    with Ledger(work / "ledger.db") as ledger:
        sub = Submitter(site, ledger, client).submit(load_job_spec(spec_file), spec_file)
        job = ledger.jobs.get(sub.ledger_ids[0])
        journal = Journal(Path(job["job_dir"]) / "journal")
        try:
            for k in range(args.preemptions):
                # Preempt a few steps into run k, at a varying distance from the last periodic save.
                wait(lambda: len(kinds(journal, "startup")) == k + 1, 300, f"run {k} to start")
                target = kinds(journal, "startup")[-1]["resumed_from"] + 7 + 5 * k
                wait(lambda: any(r["step"] >= target for r in kinds(journal, "metrics")[-3:]), 300, "training")
                Submitter(site, ledger, client).submit(JobSpec.model_validate(HIGH), "<high>")
                wait(lambda: len(kinds(journal, "requeue")) == k + 1, 120, f"preemption {k + 1}")
            wait(lambda: len(kinds(journal, "startup")) == args.preemptions + 1, 300, "the last resumed run")
            time.sleep(3)  # sacct lags
            runs = parse_parsable_with_header(client.run(
                "sacct", "-X", "-D", "--parsable2", "--format=JobID,State,Eligible,Start,End", "-j", job["slurm_job_id"]))
        finally:
            client.scancel([job["slurm_job_id"]])
    requeues, startups = kinds(journal, "requeue"), kinds(journal, "startup")
    runs.sort(key=lambda r: r["Start"])
    parts = [split(requeues[k], startups[k + 1], runs[k], runs[k + 1]) for k in range(args.preemptions)]
    lost = [requeues[k]["step"] - startups[k + 1]["resumed_from"] for k in range(args.preemptions)]

    slurm = f"Slurm {features.version}"
    print(f"signal -> first resumed step, {args.preemptions} QOS preemptions on {slurm} (tiny GPT, 2 ranks, CPU; "
          f"requeue delay {features.requeue_delay_s} s from {features.requeue_delay_from})")
    print(f"  {'':22}" + "".join(f"{'#' + str(k + 1):>9}" for k in range(len(parts))) + f"{'median':>9}")
    for row in ROWS:
        values = [p[row] for p in parts]
        tag = " (Slurm)" if row in SLURM_ROWS else ""
        print(f"  {row + tag:22}" + "".join(f"{v:9.2f}" for v in values) + f"{statistics.median(values):9.2f}")
    ours = [sum(v for r, v in p.items() if r not in SLURM_ROWS) for p in parts]
    total = [sum(p.values()) for p in parts]
    print(f"  {'hpctrain part':22}" + "".join(f"{v:9.2f}" for v in ours) + f"{statistics.median(ours):9.2f}   goal <= 5 s")
    print(f"  {'total':22}" + "".join(f"{v:9.2f}" for v in total) + f"{statistics.median(total):9.2f}")
    print(f"  steps lost per preemption: {lost} (goal 0)")
    figure(f"signal -> first resumed step, hpctrain's part, Slurm excluded (median, {slurm})",
           statistics.median(ours), "s", "<= 5 s", statistics.median(ours) <= 5)
    figure(f"signal -> first resumed step, total incl. Slurm's requeue delay (median, {slurm})",
           statistics.median(total), "s")
    figure(f"training steps lost per preemption (max, {slurm})", max(lost), "steps", "0", max(lost) == 0)


if __name__ == "__main__":
    main()
