"""A rank stopped with SIGSTOP under `[hang] step_s = 15` and `retry.in_place = 1`: how long until hpctrain finds
it, and until the first step of the step restarted in place.

    scripts/dev-cluster up && .venv/bin/python benchmarks/hang_detection.py [--stops 2] [--step-s 15]

Four jobs, each stopped ``--stops`` times (one job per stop, a few steps after its start):
  reference    hpctrain's trainer (benchmarks/preemption_resume.py's tiny GPT, 2 ranks tp=2), rank 1 stopped,
               the memory tier every 5 steps
  dcp          scripts/examples/dcp_loop.py on 2 ranks (hpctrain's guard, DCP every 20 steps), rank 1 stopped
  hf           scripts/examples/hf_trainer.py (hpctrain's callback), its one rank stopped
  lightning    scripts/examples/lightning_loop.py (hpctrain's callback), its one rank stopped
The examples run 0.1 s steps. Per stop: to the hang event (the batch script's journal: the step found hung,
stacks written, the step ended), and to the first resumed step (the trainer's journal; for the examples, the
first step recorded by the restarted step). Goal (issue 43): both within the timeout + 10 s, the stopped rank
named as stopped.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpctrain.config import load_job_spec, load_site
from hpctrain.config.job import JobSpec
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.slurm import SlurmClient
from hpctrain.submit import Submitter

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from _figures import figure  # noqa: E402
from _preempt import wait  # noqa: E402
from helpers.train import rank_pid  # noqa: E402
from preemption_resume import kinds, workspace, write_spec  # noqa: E402

EXAMPLES = REPO / "scripts" / "examples"
STEPS = 400
# name -> (the example, its ranks, the rank stopped, extra arguments)
EXAMPLE_CASES = {"dcp": ("dcp_loop.py", 2, 1, ["--every", "20"]), "hf": ("hf_trainer.py", 1, 0, []),
                 "lightning": ("lightning_loop.py", 1, 0, [])}


def progress_steps(path: Path) -> list[int]:
    return [int(s) for s in path.read_text().split()] if path.exists() else []


def restarted(steps: list[int]) -> bool:
    """Whether the restarted step has recorded its first step (a step number not above the one before)."""
    return any(b <= a for a, b in zip(steps, steps[1:]))


def stop_once(spec: JobSpec, spec_file: str, rank: int, program: str, started: Callable[[], Any],
              resumed: Callable[[], Any], journal_of: Callable[[dict], Journal]) -> dict[str, Any]:
    """Submit, stop ``rank`` once ``started()``; the seconds to the hang event and to ``resumed()`` (a time)."""
    site = load_site("dev")
    client = SlurmClient.for_site(site)
    with Ledger(Path(os.environ["HPCTRAIN_LEDGER"])) as ledger:
        job = ledger.jobs.get(Submitter(site, ledger, client).submit(spec, spec_file).ledger_ids[0])
        journal = journal_of(job)
        try:
            wait(started, 300, "training")
            pid = wait(lambda: rank_pid(ledger.jobs.get(job["id"])["slurm_job_id"], rank, program), 30, "the rank")
            stopped_at = time.time()
            os.kill(pid, signal.SIGSTOP)
            hang = wait(lambda: kinds(journal, "hang"), 300, "the hang event", interval=0.05)[0]
            resumed_at = wait(resumed, 300, "the first resumed step", interval=0.02)
        finally:
            client.scancel([ledger.jobs.get(job["id"])["slurm_job_id"]])
    named = f"rank {rank} (stopped by a signal" in hang["message"]
    return {"to hang event": hang["time"] - stopped_at, "to resumed step": resumed_at - stopped_at, "named": named}


def reference(work: Path, index: Path, step_s: float, k: int) -> dict[str, Any]:
    extra = f"memory_every_steps = 5\n[retry]\nin_place = 1\n[hang]\nstep_s = {step_s}\n"
    spec_file = write_spec(work / f"reference-{k}.toml", index, work / f"ckpt-reference-{k}", extra)
    journal: list[Journal] = []

    def journal_of(job: dict) -> Journal:
        journal.append(Journal(Path(job["job_dir"]) / "journal"))
        return journal[0]

    def resumed() -> float | None:
        starts = kinds(journal[0], "startup")
        return starts[1]["times"]["first_step"] if len(starts) > 1 else None

    return stop_once(load_job_spec(spec_file), str(spec_file), 1, "hpctrain.train",
                     lambda: any(r["step"] >= 12 for r in kinds(journal[0], "metrics")[-3:]), resumed, journal_of)


def example(work: Path, case: str, step_s: float, k: int) -> dict[str, Any]:
    script, ranks, rank, extra = EXAMPLE_CASES[case]
    progress = work / f"{case}-{k}.progress"
    spec = JobSpec.model_validate({
        "name": f"bench-hang-{case}", "hang": {"step_s": step_s}, "retry": {"in_place": 1},
        "command": [sys.executable, str(EXAMPLES / script), str(work / f"{case}-{k}"), "--steps", str(STEPS),
                    "--step-s", "0.1", "--progress", str(progress), *extra],
        "resources": {"gpus_per_node": 2, "tasks_per_node": ranks, "mem": "2G", "time": "00:15:00", "account": "teama"}})

    def resumed() -> float | None:
        return time.time() if restarted(progress_steps(progress)) else None

    return stop_once(spec, "<benchmark>", rank, script, lambda: len(progress_steps(progress)) >= 25, resumed,
                     lambda job: Journal(Path(job["job_dir"]) / "journal"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stops", type=int, default=2)
    parser.add_argument("--step-s", type=float, default=15.0, help="the spec's [hang] step_s")
    args = parser.parse_args()
    work, index = workspace("hpctrain-bench-hang-")
    runs = {"reference": [reference(work, index, args.step_s, k) for k in range(args.stops)]}
    runs |= {case: [example(work, case, args.step_s, k) for k in range(args.stops)] for case in EXAMPLE_CASES}
    print(f"a rank SIGSTOPped, [hang] step_s = {args.step_s:g}, retry.in_place = 1: median s over {args.stops} stops "
          "(CPU, dev cluster)")
    print(f"  {'case':12}{'to hang event':>16}{'to resumed step':>18}  named as stopped")
    bound = args.step_s + 10
    for case, stops in runs.items():
        found, resumed = (statistics.median(s[row] for s in stops) for row in ("to hang event", "to resumed step"))
        named = all(s["named"] for s in stops)
        print(f"  {case:12}{found:16.1f}{resumed:18.1f}  {'yes' if named else 'NO'}")
        worst = max(s["to resumed step"] for s in stops)
        figure(f"SIGSTOPped rank -> first resumed step, {case} (worst of {args.stops})", worst, "s",
               f"<= step_s + 10 = {bound:g} s (issue 43)", worst <= bound and named)


if __name__ == "__main__":
    main()
