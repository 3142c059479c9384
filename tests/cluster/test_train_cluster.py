"""The reference GPT across two nodes of the dev cluster (sbatch -> hpctrain launch -> srun), against one process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.jobs.logs import LABEL
from hpctrain.jobs.poll import Poller, job_summaries
from hpctrain.ledger import Ledger
from hpctrain.slurm import SlurmClient
from hpctrain.slurm.states import TERMINAL
from hpctrain.submit import Submitter

from helpers.lanes import lanes
from helpers.train import TINY_MODEL, reference_losses
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS = 3

SPEC = """\
name = "gpt-{name}"
command = ["python", "-m", "hpctrain.train", "--spec", "{spec}", "--steps", "{steps}"]
seed = 7
hyperparameters = {{ lr = 1e-3 }}

[resources]
nodes = 2
gpus_per_node = 2
cpus_per_task = 1
mem = "2G"
time = "00:10:00"

[parallel]
dp = {dp}
tp = {tp}
pp = {pp}
micro_batch = 2
grad_accum = 2

[model]
{model}
"""


@lanes(why="training numerics; the preemption and requeue tests cover each release")
def test_two_node_layouts_match_a_single_process(dev_cluster, isolated_ledger, tmp_path):
    site = load_site("dev")
    model = "\n".join(f"{k} = {v}" for k, v in TINY_MODEL.items())
    layouts = {"tp2pp2": (1, 2, 2), "dp2pp2": (2, 1, 2)}
    subs, specs = {}, {}
    with Ledger(isolated_ledger) as ledger:
        for name, (dp, tp, pp) in layouts.items():
            path = tmp_path / f"{name}.toml"
            path.write_text(SPEC.format(name=name, spec=path, steps=STEPS, dp=dp, tp=tp, pp=pp, model=model))
            specs[name] = load_job_spec(path)
            subs[name] = Submitter(site, ledger).submit(specs[name], path)
        poller = Poller(ledger, SlurmClient.for_site(site), "dev")

        def finished():
            poller.refresh()
            rows = job_summaries(ledger, "dev")
            return rows if all(r["state"] in TERMINAL for r in rows) else None

        rows = wait_until(finished, 420, 3.0, "both training jobs to finish")
        assert {r["state"] for r in rows} == {"COMPLETED"}, rows
        for name, sub in subs.items():
            job = ledger.jobs.get(sub.ledger_ids[0])
            out = (Path(job["job_dir"]) / f"slurm-{sub.slurm_ids[0]}.out").read_text()
            out = LABEL.sub("", out)  # srun --label's "3: "
            steps = [json.loads(ln) for ln in out.splitlines() if ln.startswith('{"step"')]
            expected = reference_losses(specs[name], STEPS)
            assert [s["step"] for s in steps] == list(range(1, STEPS + 1)), out[-2000:]
            for got, want in zip((s["loss"] for s in steps), expected):
                assert abs(got - want) <= 1e-5 * abs(want), (name, got, want)
