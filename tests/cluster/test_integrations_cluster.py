"""Training code hpctrain did not write, preempted twice by QOS high jobs on the dev cluster: a Hugging Face
`Trainer` (hpctrain.integrations.hf), a Lightning run (hpctrain.integrations.lightning) and a torchrun-style
DCP loop on 2 ranks (scripts/examples/dcp_loop.py).
Each stops at a step boundary on the notice, saves in its own format, is requeued by hpctrain's batch script,
runs every step exactly once, and ends with the weights of a run never preempted, bit for bit; what the
frameworks log (training and held-out losses) is in the ledger, each step once.

On the host's Slurm only: what differs between releases (the notice, who requeues) is the batch script's,
which the lanes test with the executor and the guarded loop; these add minutes, not coverage of Slurm."""

from __future__ import annotations

import os
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
}


# What the frameworks log in STEPS steps (every 25, held out every 50), through hpctrain's callback or logger: the
# Trainer numbers its steps from 1 and evaluates at its last step too, Lightning's logger counts from 0 and also
# logs the training loss of the step a run stops at (a stop skips Lightning's validation: the grace time is the
# checkpoint's).
LOGGED = {"hf-trainer": {"loss": [25, 50], "eval/loss": [50, 60]},
          "lightning": {"train_loss": [24, 49], "eval/loss": [49]}}
AT_STOPS = {"lightning": "train_loss"}


@pytest.mark.parametrize("case", list(CASES))
def test_preempted_twice_ends_with_the_weights_of_a_straight_run(case, dev_cluster, isolated_ledger, tmp_path):
    script, ranks, final, straight_launcher = CASES[case]
    progress, out = tmp_path / "progress", tmp_path / "preempted"
    spec = JobSpec.model_validate({
        "name": case, "command": [sys.executable, str(EXAMPLES / script), str(out), "--steps", str(STEPS),
                                  "--step-s", "0.1", "--progress", str(progress)],
        "resources": {"gpus_per_node": 2, "tasks_per_node": ranks, "mem": "2G", "time": "00:15:00",
                      "account": "teama", "preemptible": True}})
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
    # The run never preempted, outside Slurm, once the job's ranks are gone: two 2-rank gloo groups at once on
    # this host's 2 cores once failed the straight one.
    alone = subprocess.run([*straight_launcher, str(EXAMPLES / script), str(tmp_path / "straight"), "--steps", str(STEPS)],
                           capture_output=True, text=True, cwd=tmp_path)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert [r["cause"] for r in requeued()] == ["preemption"] * 2
    assert ran() == [str(s) for s in range(1, STEPS + 1)]  # no step lost, none run twice
    preempted, straight = read_weights(out / final), read_weights(tmp_path / "straight" / final)
    assert preempted.keys() == straight.keys()
    assert all(torch.equal(preempted[k], straight[k]) for k in straight)
