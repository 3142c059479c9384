"""The reference trainer's step time with `[eval] on_checkpoint` evaluation jobs running beside it, against the same
job without them, on the dev cluster.

    scripts/dev-cluster up && .venv/bin/python benchmarks/eval_jobs_beside.py [--steps 200] [--every 25]

Both runs are the same spec (the reference GPT of the quickstart's size, tp=2 x pp=2 on one node of 4 GPUs,
standard-library text, a checkpoint every --every steps); the second also says `on_checkpoint = true`, and a
driver reconciles every 2 s as cron would, so each new checkpoint gets an evaluation job (the held-out loss, one
task on another node) while training goes on. The figure is the ratio of median step times. On a GPU cluster the
evaluation jobs run on other nodes' GPUs and CPUs; on this 2-core VM every dev-cluster node is the same two cores,
so the ratio here measures the evaluation jobs' CPU next to the trainer's, an upper bound.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _figures import figure

from hpctrain.config import load_job_spec, load_site
from hpctrain.data.text import pack_text
from hpctrain.evaluate.submit import follow_all
from hpctrain.jobs.reconcile import reconcile
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.states import TERMINAL
from hpctrain.submit import Submitter

SPEC = """\
name = "bench-eval-{mode}"
command = ["python", "-m", "hpctrain.train", "--steps", "{steps}"]
seed = 1
hyperparameters = {{ lr = 3e-3 }}

[resources]
gpus_per_node = 4
mem = "4G"
time = "00:20:00"

[parallel]
tp = 2
pp = 2
micro_batch = 8
grad_accum = 4

[model]
layers = 4
heads = 4
hidden = 64
vocab = 256
seq_len = 64

[data]
index = "{index}"
workers = 1

[eval]
index = "{held_out}"
batches = 8
on_checkpoint = {on}

[checkpoint]
dir = "{ckpt}"
every_steps = {every}
keep_last = 100
"""
WARMUP = 5


def run(workdir: Path, mode: str, steps: int, every: int, index: Path, held_out: Path) -> tuple[float, int]:
    """(median step time, evaluation jobs that ran while the job trained) of one run."""
    spec = workdir / f"{mode}.toml"
    spec.write_text(SPEC.format(mode=mode, steps=steps, every=every, index=index, held_out=held_out,
                                on=str(mode == "beside").lower(), ckpt=workdir / f"ck-{mode}"))
    site = load_site("dev")
    client = SlurmClient.for_site(site)
    with Ledger(workdir / "ledger.db") as ledger:
        job = Submitter(site, ledger).submit(load_job_spec(spec), spec).ledger_ids[0]
        while True:
            reconcile(ledger, client, site.name)
            follow_all(ledger, site, 0.0)
            row = ledger.jobs.known(job)
            if row["state"] in TERMINAL:
                break
            time.sleep(2)
        if row["state"] != "COMPLETED":
            raise SystemExit(f"benchmark job {job} ended {row['state']}")
        ended = row["ended_at"] or time.time()
        evals = [e["eval_job_id"] for e in ledger.evaluations.of_job(job) if e["eval_job_id"]]
        overlapped = sum(1 for i in evals if (ledger.jobs.known(i)["started_at"] or ended) < ended)
        journal = Journal(Path(row["job_dir"] or "") / "journal")
    steps_s = [r["values"]["step_time_s"] for _, r in journal.records(["metrics"]) if "step_time_s" in r["values"]]
    return statistics.median(steps_s[WARMUP:]), overlapped


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=25)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="hpctrain-bench-eval-", dir="/var/tmp"))
    workdir.chmod(0o755)
    train, held = pack_text(workdir / "text", [], 64, 2 * 2**20, 16 * 2**20, held_out_bytes=2**20)
    assert held is not None
    alone, _ = run(workdir, "alone", args.steps, args.every, train.path, held.path)
    beside, overlapped = run(workdir, "beside", args.steps, args.every, train.path, held.path)
    print(f"median step time, steps {WARMUP + 1}..{args.steps}: alone {alone * 1000:.1f} ms, with evaluation jobs "
          f"beside {beside * 1000:.1f} ms ({overlapped} evaluation jobs started while it trained)")
    figure("step time with on_checkpoint evaluation jobs beside / alone", beside / alone, "x",
           goal="(this VM: shared 2 cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
