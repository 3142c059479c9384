"""Plain submitit against hpctrain's executor: the same Python loop, preempted N times by QOS high jobs.

    scripts/dev-cluster up && .venv/bin/python benchmarks/submitit_preemption.py [--preemptions 3] [--steps 300]

The loop (``--steps`` steps of 0.1 s, one submitit `Checkpointable`, in QOS low on one node with 2 GPUs)
runs three ways, one after another on the same cluster:
  submitit, disk    plain `submitit.SlurmExecutor`; the loop saves its state to a file every 50 steps and
                    `checkpoint()` resubmits it to resume from that file: what submitit's docs advise for
                    a model (dump it in a standard format, do not pickle it), so the steps since the last
                    save are recomputed
  submitit, memory  plain submitit, `checkpoint()` pickles the loop's state as it is when the signal
                    handler runs: the strongest a submitit user can do; the step under way runs again
  hpctrain          `hpctrain.submit.executor.Executor`; the loop asks `should_stop()` after each step and
                    calls `requeue()`: its `checkpoint()` is taken between two steps
Each preemption comes a varying number of steps into a run. Per way: steps lost per preemption (steps
run minus steps), preemption to the first resumed step (from the high job's submission to the end of the
next run's first step began; Slurm's requeue delay, 10 s here before 25.11, is most of it), wall time from
submit to result, and that the result equals an uninterrupted run's.

Then the cost of watching: ``--watch`` calls (default 1,000) of a function that sleeps, as one
`map_array` each way, held behind a blocker job so none runs, and every job's `done()` asked once a
second for ``--watch-s`` seconds, as a user's wait loop does: sacct calls per minute, counted by a
wrapper on PATH, plain submitit (its own watcher) against hpctrain (the ledger's poller).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import submitit

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.ledger import Ledger
from hpctrain.runtime.function import requeue, should_stop
from hpctrain.submit import Submitter
from hpctrain.submit.executor import Executor

from _figures import figure
from _preempt import HIGH, wait

STEP_S = 0.1
# Holds the watched arrays (afterok) without taking a node's GPUs from anything else.
BLOCKER = {"name": "bench-blocker", "command": ["sleep", "3600"], "launcher": "none",
           "resources": {"mem": "100M", "time": "01:05:00", "account": "teama"}}


class Loop(submitit.helpers.Checkpointable):
    """Sum 1..steps, a step each STEP_S; ``progress`` gets a line per step begun (its number and when) and one
    per run started.
    ``save_every``: keep the state in ``state_file`` every that many steps and resume from it (else the
    state lives in the object, pickled by checkpoint())."""

    def __init__(self, steps: int, progress: Path, save_every: int = 0):
        self.steps, self.progress, self.save_every = steps, progress, save_every
        self.state = {"step": 0, "total": 0}

    @property
    def state_file(self) -> Path:
        return self.progress.with_suffix(".state")

    def __call__(self) -> dict[str, Any]:
        if self.save_every and self.state_file.exists():
            self.state = json.loads(self.state_file.read_text())
        with self.progress.open("a") as f:
            f.write(f"start {self.state['step']} {time.time()}\n")
        while self.state["step"] < self.steps:
            with self.progress.open("a") as f:
                f.write(f"{self.state['step'] + 1} {time.time()}\n")
            time.sleep(STEP_S)
            step = self.state["step"] + 1
            self.state = {"step": step, "total": self.state["total"] + step}
            if self.save_every and step % self.save_every == 0:
                self.state_file.write_text(json.dumps(self.state))
            if should_stop():
                requeue()
        return self.state

    def checkpoint(self, *args: Any, **kwargs: Any) -> submitit.helpers.DelayedSubmission:
        if self.save_every:  # the model is not pickled: the next run reads the last save
            self.state = {"step": 0, "total": 0}
        return super().checkpoint(*args, **kwargs)


def lines(progress: Path) -> list[str]:
    return progress.read_text().splitlines() if progress.exists() else []


def last_step(progress: Path) -> int:
    return next((int(ln.split()[0]) for ln in reversed(lines(progress)) if not ln.startswith("start")), 0)


def run_way(way: str, work: Path, steps: int, preemptions: int, site, ledger: Ledger) -> dict[str, Any]:
    progress = work / f"{way.replace(', ', '-')}.progress"
    loop = Loop(steps, progress, save_every=50 if way == "submitit, disk" else 0)
    if way == "hpctrain":
        ex: submitit.SlurmExecutor = Executor(site, ledger)
        ex.update_parameters(time=20, mem="1GB", gpus_per_node=2, account="teama", preemptible=True,
                             job_name="bench-loop")
    else:
        ex = submitit.SlurmExecutor(work / "submitit")
        ex.update_parameters(time=20, mem="1GB", gpus_per_node=2, account="teama", qos="low", partition="gpu",
                             job_name="bench-loop")
    t0, submitted, resumes = time.monotonic(), time.time(), []
    job = ex.submit(loop)
    for k in range(preemptions):
        starts = lambda: [ln for ln in lines(progress) if ln.startswith("start")]  # noqa: E731
        wait(lambda: len(starts()) == k + 1, 300, f"{way}: run {k} to start")
        begun = int(starts()[-1].split()[1])  # "start STEP TIME"
        target = begun + 17 + 11 * k  # a varying distance from the last periodic save
        wait(lambda: last_step(progress) >= target, 300, f"{way}: run {k} to train")
        preempted_at = time.time()
        Submitter(site, ledger).submit(JobSpec.model_validate(HIGH), "<high>")
        wait(lambda: len(starts()) == k + 2 and not lines(progress)[-1].startswith("start"), 300,
             f"{way}: preemption {k + 1} to resume")
        resumes.append(float(lines(progress)[-1].split()[1]) - preempted_at)
    result = job.result()
    wall, returned = time.monotonic() - t0, time.time()
    ran = [ln for ln in lines(progress) if not ln.startswith("start")]
    return {"lost": (len(ran) - steps) / preemptions, "wall_s": wall, "resume_s": statistics.median(resumes),
            "start_s": float(ran[0].split()[1]) - submitted,
            "result_s": returned - float(ran[-1].split()[1]) - STEP_S,
            "exact": result == {"step": steps, "total": steps * (steps + 1) // 2}}


def sacct_counter(work: Path) -> Callable[[], int]:
    """A wrapper of sacct first on PATH (for this process and what it starts) that counts its calls."""
    bin_dir, log = work / "bin", work / "sacct.calls"
    bin_dir.mkdir()
    wrapper = bin_dir / "sacct"
    wrapper.write_text(f'#!/bin/sh\necho >> {log}\nexec {shutil.which("sacct")} "$@"\n')
    wrapper.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}:{os.environ['PATH']}"
    return lambda: len(log.read_text().splitlines()) if log.exists() else 0


def watch_cost(way: str, work: Path, count: int, seconds: float, site, ledger: Ledger, calls: Callable[[], int],
               blocker: str) -> float:
    """sacct calls per minute while ``count`` held calls are waited on one way."""
    if way == "hpctrain":
        ex: submitit.SlurmExecutor = Executor(site, ledger)
        ex.update_parameters(account="teama", preemptible=False)
    else:
        ex = submitit.SlurmExecutor(work / "submitit-watch")
        ex.update_parameters(account="teama", qos="normal", partition="gpu")
    ex.update_parameters(time=5, mem="100MB", job_name="bench-watch", dependency=f"afterok:{blocker}")
    jobs = ex.map_array(time.sleep, [1] * count)
    before, t0 = calls(), time.monotonic()
    while time.monotonic() - t0 < seconds:
        assert not any(j.done() for j in jobs)
        time.sleep(1)
    per_minute = (calls() - before) * 60 / (time.monotonic() - t0)
    for job_id in {j.job_id.split("_")[0] for j in jobs}:
        subprocess.run(["scancel", job_id], check=True)
    return per_minute


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preemptions", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--watch", type=int, default=1000, help="calls waited on for the sacct count")
    parser.add_argument("--watch-s", type=float, default=60.0)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpctrain-bench-submitit-"))
    os.environ["HPCTRAIN_LEDGER"] = str(work / "ledger.db")
    site = load_site("dev")
    found = {}
    with Ledger(work / "ledger.db") as ledger:
        for way in ("submitit, disk", "submitit, memory", "hpctrain"):
            found[way] = run_way(way, work, args.steps, args.preemptions, site, ledger)
            f = found[way]
            print(f"{way:17s} steps lost per preemption {f['lost']:5.1f}   preemption to first resumed step "
                  f"{f['resume_s']:5.1f} s (median)   submit to first step {f['start_s']:4.1f} s   last step to "
                  f"result {f['result_s']:4.1f} s   wall {f['wall_s']:6.1f} s   result exact: {f['exact']}", flush=True)
        calls = sacct_counter(work)
        blocker = Submitter(site, ledger).submit(JobSpec.model_validate(BLOCKER), "<blocker>").slurm_ids[0]
        try:
            watched = {way: watch_cost(way, work, args.watch, args.watch_s, site, ledger, calls, blocker)
                       for way in ("submitit", "hpctrain")}
        finally:
            subprocess.run(["scancel", blocker], check=True)
        for way, per_minute in watched.items():
            print(f"{way:17s} sacct calls per minute while {args.watch} calls are waited on: {per_minute:.1f}")
    ours, disk, memory = found["hpctrain"], found["submitit, disk"], found["submitit, memory"]
    print(f"hpctrain wall / plain submitit saving to disk: {ours['wall_s'] / disk['wall_s']:.2f}x, / plain submitit "
          f"pickling in the handler: {ours['wall_s'] / memory['wall_s']:.2f}x (uninterrupted compute: "
          f"{args.steps * STEP_S:.0f} s)")
    figure("submitit loop: steps lost per preemption (hpctrain)", ours["lost"], "steps", goal="0",
           met=ours["lost"] == 0 and ours["exact"])
    figure("submitit loop: steps lost per preemption (plain submitit, disk saves every 50)", disk["lost"], "steps")
    # The baseline: a model saved the way submitit's docs advise, every 50 steps.
    figure("submitit loop: wall, hpctrain / plain submitit (disk saves every 50)", ours["wall_s"] / disk["wall_s"],
           "x", goal="<= 1.0", met=ours["wall_s"] <= disk["wall_s"])
    figure("submitit loop: wall, hpctrain / plain submitit (state pickled in the signal handler)",
           ours["wall_s"] / memory["wall_s"], "x")
    figure(f"watching {args.watch} calls: sacct calls per minute, hpctrain / plain submitit",
           watched["hpctrain"] / max(watched["submitit"], 1e-9), "x", goal="<= 1.0",
           met=watched["hpctrain"] <= watched["submitit"])


if __name__ == "__main__":
    main()
