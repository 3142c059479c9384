"""`python -m hpctrain.evaluate` on the reference trainer's checkpoints: the built-in held-out evaluator gives the
loss the training loop journaled at that step; a checkpoint that fails verification gives no result; each outcome is
journaled and folded into the ledger's evaluations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from hpctrain.config import load_job_spec
from hpctrain.contract import EVAL_LOSS, JOB_ID_ENV, JOURNAL_ENV, SPEC_ENV
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table

from helpers.data import flip_byte
from helpers.train import TINY_MODEL, pack_text_dataset, train_ranks, trainer_spec

# One worker for the module: its trained fixture (about a minute under CI's load) is made once, not on each worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("evaluate-trained")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tp=2 x pp=2 run of 6 steps holding out a quarter of its shards, checkpointed at 3 and 6: (spec as JSON,
    checkpoints, the loop's eval/loss by step)."""
    tmp = tmp_path_factory.mktemp("trained")
    index = pack_text_dataset(tmp / "data", TINY_MODEL["seq_len"], count=200, shard_bytes=4096).path
    toml = tmp / "spec.toml"
    toml.write_text(trainer_spec("gpt-eval", seed=7, index=index, ckpt=tmp / "ck", every_steps=3,
                                 resources={"gpus_per_node": 4}) + "\n[eval]\nholdout = 0.25\nbatches = 1\n")
    train_ranks(toml, 6, tmp / "journal")
    spec = tmp / "spec.json"
    spec.write_text(json.dumps(load_job_spec(toml).model_dump(mode="json", by_alias=True)))
    loop = {r["step"]: r["values"][EVAL_LOSS] for _, r in Journal(tmp / "journal").records(["metrics"])
            if EVAL_LOSS in r["values"]}
    return spec, tmp / "ck", loop


def known_jobs(ledger: Ledger) -> None:
    """The trained job (1) and its evaluation job (2), as `hpctrain eval` would have recorded them."""
    for name in ("gpt-eval", "gpt-eval-eval"):
        Table(ledger, "jobs").insert({"name": name, "site": "dev", "state": "COMPLETED"})


def evaluate(spec, ckpt, step: int, journal, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, SPEC_ENV: str(spec), JOURNAL_ENV: str(journal), JOB_ID_ENV: "2", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "hpctrain.evaluate", "--of", "1", "--step", str(step),
                           "--checkpoint", str(ckpt / f"step_{step:08d}"), *extra], capture_output=True, text=True,
                          env=env, timeout=300)


def test_heldout_gives_the_loss_the_loop_journaled_at_that_step(trained, tmp_path):
    spec, ckpt, loop = trained
    done = evaluate(spec, ckpt, 6, tmp_path / "journal", "--evaluator", "heldout")
    assert done.returncode == 0, done.stderr
    (_, record), = Journal(tmp_path / "journal").records(["evaluation"])
    assert record["of_job"] == 1 and record["step"] == 6 and record["evaluator"] == "heldout"
    assert record["metrics"][EVAL_LOSS] == pytest.approx(loop[6], rel=1e-5)  # one process = the 4-rank loop
    assert f"job 1 step 6 (heldout): {EVAL_LOSS} " in done.stdout
    with Ledger(tmp_path / "ledger.db") as ledger:
        known_jobs(ledger)
        ingest_journal(ledger, Journal(tmp_path / "journal"))
        (row,) = ledger.evaluations.of_job(1)
        assert (row["step"], row["evaluator"], row["state"]) == (6, "heldout", "done")
        assert json.loads(row["metrics_json"])[EVAL_LOSS] == record["metrics"][EVAL_LOSS]


def test_a_checkpoint_that_fails_verification_gives_no_result(trained, tmp_path):
    spec, ckpt, _ = trained
    broken = tmp_path / "ck"
    shutil.copytree(ckpt / "step_00000003", broken / "step_00000003")
    chunk = max((p for p in (broken / "step_00000003").rglob("*") if p.is_file() and "model." in str(p)),
                key=lambda p: p.stat().st_size)
    flip_byte(chunk, chunk.stat().st_size // 2)
    done = evaluate(spec, broken, 3, tmp_path / "journal", "--evaluator", "mine", "--", sys.executable, "-c", "1")
    assert done.returncode == 1
    assert done.stderr.startswith(f"hpctrain.evaluate: error: {broken / 'step_00000003'}: fails verification: ")
    assert len(done.stderr.splitlines()) == 1
    with Ledger(tmp_path / "ledger.db") as ledger:
        known_jobs(ledger)
        ingest_journal(ledger, Journal(tmp_path / "journal"))
        (row,) = ledger.evaluations.of_job(1)
        assert row["state"] == "failed" and row["metrics_json"] is None and "fails verification" in row["error"]


def test_a_user_evaluator_that_crashes_records_its_error(trained, tmp_path):
    spec, ckpt, _ = trained
    done = evaluate(spec, ckpt, 3, tmp_path / "journal", "--evaluator", "mine", "--", sys.executable, "-c",
                    "raise SystemExit(4)")
    assert done.returncode == 1 and done.stderr.endswith("exited 4\n")
    (_, record), = Journal(tmp_path / "journal").records(["evaluation"])
    assert record["error"].startswith("evaluator mine: ") and "metrics" not in record
