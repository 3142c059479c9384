"""`hpctrain eval` on the dev cluster: evaluation jobs on a trained job's committed checkpoints, each once, their
values (or errors) in the ledger, in `show` and in `metrics`."""

from __future__ import annotations

import json
import sys

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.contract import EVAL_LOSS
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.submit import Submitter

from helpers.cli import run_cli
from helpers.cluster import finish
from helpers.paths import REPO
from helpers.train import TINY_MODEL, pack_text_dataset, trainer_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_each_checkpoint_is_evaluated_once_and_the_results_are_in_the_ledger(dev_cluster, isolated_ledger, tmp_path):
    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=200, shard_bytes=4096).path
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes((REPO / "hpctrain" / "cli" / "__init__.py").read_bytes())  # text it never trained on
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        trainer_spec("gpt-evaluated", seed=7, index=index, ckpt=tmp_path / "ck", every_steps=3, steps=6,
                     resources={"gpus_per_node": 4, "mem": "2G", "time": "00:10:00"})
        + "keep_last = 2\n\n[eval]\nholdout = 0.25\nbatches = 1\n\n[eval.evaluators]\n"
        + f'ppl = {json.dumps([sys.executable, str(REPO / "scripts/examples/eval_ppl.py"), "--corpus", str(corpus)])}\n'
        + f'broken = {json.dumps([sys.executable, "-c", "print(1)"])}\n')
    site = load_site("dev")
    env = {"HPCTRAIN_LEDGER": str(isolated_ledger)}
    with Ledger(isolated_ledger) as ledger:
        job = Submitter(site, ledger).submit(load_job_spec(spec_path), spec_path).ledger_ids[0]
        assert finish(ledger, job, timeout=420, supervise=True) == "COMPLETED"
        journal = Journal(ledger.jobs.known(job)["job_dir"] + "/journal")
    loop = {r["step"]: r["values"][EVAL_LOSS] for _, r in journal.records(["metrics"]) if EVAL_LOSS in r["values"]}

    every = run_cli("eval", str(job), "--all", "--evaluator", "heldout", env=env)
    newest = run_cli("eval", str(job), "--evaluator", "ppl", "--evaluator", "broken", env=env)
    assert every.returncode == 0 and newest.returncode == 0, every.stderr + newest.stderr
    assert [ln.split(":")[0] for ln in every.stdout.splitlines()] == ["step 3 with heldout", "step 6 with heldout"]
    assert [ln.split(":")[0] for ln in newest.stdout.splitlines()] == ["step 6 with ppl", "step 6 with broken"]
    eval_jobs = [int(ln.rsplit(" ", 1)[1]) for ln in (every.stdout + newest.stdout).splitlines()]
    again = run_cli("eval", str(job), "--all", "--evaluator", "heldout", env=env)
    assert again.stdout.count("asked for before") == 2, again.stdout  # exactly once: nothing submitted again

    with Ledger(isolated_ledger) as ledger:
        states = [finish(ledger, j, timeout=300, supervise=True) for j in eval_jobs]
        assert states == ["COMPLETED"] * 3 + ["FAILED"], states  # the broken evaluator writes no metrics
        finish(ledger, job, supervise=True)  # a last reconcile folds the evaluation jobs' journals in
        rows = {(r["step"], r["evaluator"]): r for r in ledger.evaluations.of_job(job)}
    assert set(rows) == {(3, "heldout"), (6, "heldout"), (6, "ppl"), (6, "broken")}
    for step in (3, 6):  # one process on the checkpoint = the 4-rank loop at that step
        assert json.loads(rows[(step, "heldout")]["metrics_json"])[EVAL_LOSS] == pytest.approx(loop[step], rel=1e-5)
    ppl = json.loads(rows[(6, "ppl")]["metrics_json"])
    assert ppl["ppl"] == pytest.approx(2 ** ppl["bpb"]) and ppl["ppl"] > 1 and ppl["bytes"] > 0
    assert rows[(6, "broken")]["state"] == "failed" and rows[(6, "broken")]["metrics_json"] is None
    assert "wrote no metrics" in rows[(6, "broken")]["error"]

    shown = run_cli("show", str(job), env=env)
    assert "evaluations" in shown.stdout and "wrote no metrics" in shown.stdout
    metrics = run_cli("metrics", str(job), "--name", "heldout:eval/loss", "--json", env=env)
    assert [json.loads(ln)["step"] for ln in metrics.stdout.splitlines()] == [3, 6]
