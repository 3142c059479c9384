"""Training code hpctrain did not write, preempted twice by QOS high jobs on the dev cluster: a Hugging Face
`Trainer` (hpctrain.integrations.hf), a Lightning run (hpctrain.integrations.lightning) and a torchrun-style
DCP loop on 2 ranks (scripts/examples/dcp_loop.py).
Each stops at a step boundary on the notice, saves in its own format, is requeued by hpctrain's batch script,
runs every step exactly once, and ends with the weights of a run never preempted, bit for bit; what the
frameworks log (training and held-out losses) is in the ledger, each step once; the Trainer also with random masking
and 2 DataLoader workers, exact through hpctrain's BatchSeeded collator. And a rank of the Trainer and of
the DCP loop stopped with SIGSTOP under the spec's `[hang]`: found, its stacks kept, its step restarted in place.

On the host's Slurm only: what differs between releases (the notice, who requeues) is the batch script's,
which the lanes test with the executor and the guarded loop; these add minutes, not coverage of Slurm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.submit import Submitter

from helpers.cluster import HIGH, finish
from helpers.paths import REPO
from helpers.train import rank_pid
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(bool(os.environ.get("HPCTRAIN_LANE")), reason="host's Slurm only (see the docstring)")]

EXAMPLES = REPO / "scripts" / "examples"
STEPS = 60


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(path)
    return torch.load(path)


# name -> (script, ranks, where its final weights are, the straight run's launcher)
CASES = {
    "hf-trainer": ("hf_trainer.py", 1, "final/model.safetensors", [sys.executable]),
    "lightning": ("lightning_loop.py", 1, "final.pt", [sys.executable]),
    "dcp-2-ranks": ("dcp_loop.py", 2, "final.pt",
                    [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]),
    "hf-masked": ("hf_trainer.py", 1, "final/model.safetensors", [sys.executable]),
}
# The example's own options of a case: random masking (DataCollatorForLanguageModeling under hpctrain's BatchSeeded),
# 2 DataLoader workers, 4 batches accumulated a step, a cosine schedule; preempted mid-epoch (16 steps an epoch).
OPTIONS = {"hf-masked": ["--mlm"]}


# What the frameworks log in STEPS steps (every 25, held out every 50), through hpctrain's callback or logger: the
# Trainer numbers its steps from 1 and evaluates at its last step too, Lightning's logger counts from 0 and also
# logs the training loss of the step a run stops at (a stop skips Lightning's validation: the grace time is the
# checkpoint's).
LOGGED = {"hf-masked": {"loss": [25, 50], "eval/loss": [50, 60]},
          "lightning": {"train_loss": [24, 49], "eval/loss": [49]}}
AT_STOPS = {"lightning": "train_loss"}


def straight_run(case: str, tmp_path: Path) -> dict[str, torch.Tensor]:
    """The weights of the run never interrupted, outside Slurm, once the job's ranks are gone: two 2-rank gloo
    groups at once on this host's 2 cores once failed the straight one."""
    script, _, final, straight_launcher = CASES[case]
    alone = subprocess.run([*straight_launcher, str(EXAMPLES / script), str(tmp_path / "straight"), "--steps", str(STEPS),
                            *OPTIONS.get(case, [])], capture_output=True, text=True, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    return read_weights(tmp_path / "straight" / final)


def example_spec(case: str, out: Path, progress: Path, **fields) -> JobSpec:
    script, ranks, _, _ = CASES[case]
    return JobSpec.model_validate({
        "name": case, "command": [sys.executable, str(EXAMPLES / script), str(out), "--steps", str(STEPS),
                                  "--step-s", "0.1", "--progress", str(progress), *OPTIONS.get(case, [])],
        "resources": {"gpus_per_node": 2, "tasks_per_node": ranks, "mem": "2G", "time": "00:15:00",
                      "account": "teama", "preemptible": True}, **fields})


# The Trainer once, with random masking: the plain Trainer's case adds nothing but CI time.
@pytest.mark.parametrize("case", ["hf-masked", "lightning", "dcp-2-ranks"])
def test_preempted_twice_ends_with_the_weights_of_a_straight_run(case, dev_cluster, isolated_ledger, tmp_path):
    final = CASES[case][2]
    progress, out = tmp_path / "progress", tmp_path / "preempted"
    spec = example_spec(case, out, progress)
    site = load_site("dev")
    with Ledger(isolated_ledger) as ledger:
        job = ledger.jobs.get(Submitter(site, ledger).submit(spec, "<test>").ledger_ids[0])
        journal = Journal(Path(job["job_dir"]) / "journal")
        requeued = lambda: [r for _, r in journal.records(kinds=["attempt_end"]) if r["requeued"]]  # noqa: E731
        ran = lambda: progress.read_text().split() if progress.exists() else []  # noqa: E731
        for k in (1, 2):
            done = len(ran())
            wait_until(lambda: len(ran()) >= done + 10, 180, 0.2, f"run {k} to train")
            Submitter(site, ledger).submit(JobSpec.model_validate(HIGH), "<high>")
            wait_until(lambda: len(requeued()) == k, 120, 0.5, f"preemption {k} to requeue the job")
        assert finish(ledger, job["id"], timeout=300) == "COMPLETED"
        ingest_journal(ledger, journal)
        names = tuple(LOGGED.get(case, {}))
        logged = {n: [r["step"] for r in ledger.metrics.of_job(job["id"], names=(n,))] for n in names}
    # The framework's logged training and held-out values, each step once, whichever run logged it.
    if case in AT_STOPS:
        stops = set(logged[AT_STOPS[case]]) - set(LOGGED[case][AT_STOPS[case]])
        assert len(stops) <= 2 and stops <= {int(s) - 1 for s in ran()}, logged
        logged[AT_STOPS[case]] = [s for s in logged[AT_STOPS[case]] if s not in stops]
    assert logged == LOGGED.get(case, {})
    straight = straight_run(case, tmp_path)
    assert [r["cause"] for r in requeued()] == ["preemption"] * 2
    assert ran() == [str(s) for s in range(1, STEPS + 1)]  # no step lost, none run twice
    preempted = read_weights(out / final)
    assert preempted.keys() == straight.keys()
    assert all(torch.equal(preempted[k], straight[k]) for k in straight)


@pytest.mark.parametrize("case, rank", [("dcp-2-ranks", 1), ("hf-trainer", 0)])
def test_a_rank_stopped_by_sigstop_is_found_and_its_step_restarts_in_place(case, rank, dev_cluster, isolated_ledger,
                                                                          tmp_path):
    """The loop asks hpctrain's guard each step (the Trainer through hpctrain's callback): with `[hang] step_s` the
    rank stopped mid-run is found past its deadline, named as stopped in the hang event with the frame it was
    stopped in, its stacks kept; the step starts again in the allocation from the newest checkpoint and ends with
    the weights of a run never interrupted."""
    script, _, final, _ = CASES[case]
    progress, out = tmp_path / "progress", tmp_path / "stopped"
    spec = example_spec(case, out, progress, hang={"step_s": 10}, retry={"in_place": 1})
    if case == "dcp-2-ranks":
        spec.command += ["--every", "20"]
    with Ledger(isolated_ledger) as ledger:
        job = ledger.jobs.get(Submitter(load_site("dev"), ledger).submit(spec, "<test>").ledger_ids[0])
        journal = Journal(Path(job["job_dir"]) / "journal")
        wait_until(lambda: progress.exists() and len(progress.read_text().split()) >= 25, 180, 0.2, "25 steps")
        os.kill(rank_pid(ledger.jobs.get(job["id"])["slurm_job_id"], rank, script), signal.SIGSTOP)
        assert finish(ledger, job["id"], timeout=300) == "COMPLETED"
    (hang,) = [r for _, r in journal.records(kinds=["hang"])]
    assert hang["message"].startswith(f"hung in phase step, timeout 10 s: rank {rank} (stopped by a signal, "), hang
    stacks = Path(job["job_dir"]) / "stacks"
    assert "stopped (process state T)" in (stacks / f"run0.0-rank{rank}.txt").read_text()
    dump = (stacks / f"run0.0-stopped-rank{rank}.txt").read_text()
    # Its stack as it was stopped: inside the example (the innermost frame may be the example's or a library's it
    # called, as the stop fell), and that frame named in the hang event.
    main_thread = dump.split("Current thread ")[-1]
    assert f'{script}", line' in main_thread and "no stack" not in hang["message"].split(";")[0]
    (restart,) = [r for _, r in journal.records(kinds=["step_restart"])]
    assert restart["exit_code"] != 0
    # Steps 1..m, then from the newest checkpoint c on again: the DCP loop's (every 20 steps), the Trainer's (every
    # 50: none yet, the start).
    ran = [int(s) for s in progress.read_text().split()]
    m = next(i for i in range(1, len(ran)) if ran[i] <= ran[i - 1])
    c = ran[m] - 1
    assert ran == list(range(1, m + 1)) + list(range(c + 1, STEPS + 1)) and m >= 25
    assert c <= m and (c in (20, 40) if case == "dcp-2-ranks" else c in (0, 50))
    stopped, straight = read_weights(out / final), straight_run(case, tmp_path)
    assert stopped.keys() == straight.keys()
    assert all(torch.equal(stopped[k], straight[k]) for k in straight)
