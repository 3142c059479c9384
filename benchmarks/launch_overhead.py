"""Step time of the reference trainer under `hpctrain launch` (sbatch -> srun) vs bare torchrun, same run.

    scripts/dev-cluster up && .venv/bin/python benchmarks/launch_overhead.py [--steps 40] [--repeats 2]

Both start 4 ranks (tp=2 x pp=2) of the same model on synthetic data, on this host (the dev cluster's
nodes share it). The median step time after warm-up is compared. Goal: overhead at most 3 %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from hpctrain.config import load_job_spec, load_site
from hpctrain.jobs.logs import LABEL
from hpctrain.jobs.poll import Poller
from hpctrain.ledger import Ledger
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.states import TERMINAL

from _figures import figure

WARMUP = 5
SPEC = """\
name = "bench-launch"
command = ["python", "-m", "hpctrain.train", "--steps", "{steps}"]
seed = 1

[resources]
gpus_per_node = 4
mem = "4G"
time = "00:20:00"

[parallel]
tp = 2
pp = 2
micro_batch = 4
grad_accum = 2

[model]
layers = 4
heads = 4
hidden = 128
vocab = 256
seq_len = 64
"""


def median_step(stdout: str) -> float:
    steps = [json.loads(ln) for ln in stdout.splitlines() if ln.startswith('{"step"')]
    return statistics.median(s["step_time_s"] for s in steps[WARMUP:])


def torchrun(spec: Path, steps: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc-per-node", "4",
                          "-m", "hpctrain.train", "--spec", str(spec), "--steps", str(steps)],
                         capture_output=True, text=True, check=True, env=env)
    return median_step(out.stdout)


def under_launch(spec: Path, workdir: Path) -> float:
    from hpctrain.submit import Submitter

    site = load_site("dev")
    with Ledger(workdir / "ledger.db") as ledger:
        sub = Submitter(site, ledger).submit(load_job_spec(spec), spec)
        poller = Poller(ledger, SlurmClient.for_site(site), "dev")
        while ledger.jobs.get(sub.ledger_ids[0])["state"] not in TERMINAL:
            poller.refresh()
            subprocess.run(["sleep", "2"])
        job = ledger.jobs.get(sub.ledger_ids[0])
    if job["state"] != "COMPLETED":
        raise SystemExit(f"benchmark job {sub.slurm_ids[0]} ended {job['state']}")
    return median_step(LABEL.sub("", (Path(job["job_dir"]) / f"slurm-{sub.slurm_ids[0]}.out").read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="hpctrain-bench-"))
    spec = workdir / "spec.toml"
    spec.write_text(SPEC.format(steps=args.steps))
    bare, launched = [], []
    for _ in range(args.repeats):  # interleaved, so drifting machine load hits both alike
        bare.append(torchrun(spec, args.steps))
        launched.append(under_launch(spec, workdir))
    b, l = statistics.median(bare), statistics.median(launched)
    print(f"median step time over steps {WARMUP + 1}..{args.steps}, {args.repeats} runs each (4 ranks, tp2 x pp2, CPU)")
    print(f"  bare torchrun      {b * 1000:8.1f} ms   runs: {', '.join(f'{x * 1000:.1f}' for x in bare)}")
    print(f"  hpctrain launch    {l * 1000:8.1f} ms   runs: {', '.join(f'{x * 1000:.1f}' for x in launched)}")
    print(f"  overhead {100 * (l / b - 1):+.1f} % (goal <= 3 %)")
    figure("step time under hpctrain launch vs bare torchrun", 100 * (l / b - 1), "%", "<= 3 %", l / b - 1 <= 0.03)


if __name__ == "__main__":
    main()
