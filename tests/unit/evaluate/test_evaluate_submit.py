"""`hpctrain eval` on the login node without Slurm: which checkpoints and evaluators, and the evaluation job's spec
(the submitted jobs: tests/cluster/test_evaluate_cluster.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.errors import HpctrainError
from hpctrain.evaluate.run import Target
from hpctrain.evaluate.submit import checkpoint_of, eval_job_spec, evaluators, request, targets
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

from helpers.paths import REPO

SPEC = JobSpec.model_validate({
    **tomllib.loads((REPO / "scripts" / "examples" / "gpt-tiny.toml").read_text()),
    "env": {"TOKEN": {"secret": True}, "MODE": "fast"},
    "eval": {"index": "/d/held-out/index.json", "batches": 8, "evaluators": {"ppl": ["python", "ppl.py"]}},
})


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        job = Table(ledger, "jobs").insert({"name": "gpt-tiny", "site": "dev", "state": "COMPLETED",
                                            "spec_json": json.dumps(SPEC.redacted())})
        for step, state in ((50, "committed"), (100, "committed"), (150, "deleted")):
            ledger.checkpoints.record({"job_id": job, "task_index": -1, "step": step, "path": f"/ck/step_{step:08d}",
                                       "state": state, "created_at": 1.0})
        yield ledger


def test_the_newest_every_or_named_committed_checkpoints(ledger):
    job = ledger.jobs.known(1)
    assert [t.step for t in targets(ledger, job, None, False)] == [100]  # 150 was deleted by retention
    assert [t.step for t in targets(ledger, job, None, True)] == [50, 100]
    assert targets(ledger, job, [50], False) == [Target(1, -1, 50, Path("/ck/step_00000050"))]
    with pytest.raises(HpctrainError, match=r"^job 1: no committed checkpoint at step 150 \(committed: 50, 100\)$"):
        targets(ledger, job, [150], False)


def test_heldout_and_the_specs_own_evaluators():
    assert evaluators(SPEC, []) == {"heldout": None, "ppl": ["python", "ppl.py"]}
    assert evaluators(SPEC, ["ppl"]) == {"ppl": ["python", "ppl.py"]}
    with pytest.raises(HpctrainError, match=r"gpt-tiny: no evaluator 'bleu' \(it has: heldout, ppl\)"):
        evaluators(SPEC, ["bleu"])
    bare = JobSpec.model_validate({"name": "plain", "command": ["python", "train.py"]})
    with pytest.raises(HpctrainError, match=r"plain: nothing to evaluate with"):
        evaluators(bare, [])


def test_the_evaluation_job_is_the_training_spec_made_small(ledger):
    job = ledger.jobs.known(1)
    spec = eval_job_spec(job, Target(1, -1, 50, Path("/ck/step_00000050")), "ppl", ["python", "ppl.py"], 1, "k1")
    assert spec.name == "gpt-tiny-eval-k1" and spec.launcher == "none"
    assert spec.command == ["python", "-m", "hpctrain.evaluate", "--of", "1", "--task", "-1", "--step", "50",
                            "--checkpoint=/ck/step_00000050", "--evaluator", "ppl", "--", "python", "ppl.py"]
    r = spec.resources
    assert (r.nodes, r.gpus_per_node, r.ntasks_per_node, r.preemptible, r.time, r.account) == (1, 1, 1, True, 1800,
                                                                                             "auto")
    # One process evaluates the samples the loop did: the global batch is kept.
    assert spec.parallel.world_size == 1 and spec.parallel.samples_per_step == SPEC.parallel.samples_per_step
    assert spec.env["TOKEN"].secret and spec.env["TOKEN"].value is None  # from the environment, never "<secret>"
    assert spec.env["MODE"].value == "fast" and spec.model == SPEC.model and spec.eval == SPEC.eval
    assert spec.checkpoint.dir is None and spec.array is None


def test_an_unknown_job_or_one_without_checkpoints_is_one_line(ledger):
    site = load_site("dev")
    with pytest.raises(HpctrainError, match=r"^job 9: no such ledger id"):
        request(ledger, site, 9, None, False, [])
    Table(ledger, "jobs").insert({"name": "fresh", "site": "dev", "state": "RUNNING",
                                  "spec_json": json.dumps(SPEC.redacted())})
    with pytest.raises(HpctrainError, match=r"^job 2: no committed checkpoint in the ledger yet"):
        request(ledger, site, 2, None, False, [])


def following(ledger, monkeypatch, **policy) -> list[tuple[int, str]]:
    """(step, evaluator) of each evaluation `follow` submits for job 1 with ``policy`` as its [eval] settings; each
    submitted job is recorded as running (a ledger job of its own)."""
    from hpctrain.evaluate import submit

    spec = SPEC.model_dump(mode="json", by_alias=True)
    spec["eval"].update(on_checkpoint=True, **policy)
    Table(ledger, "jobs").update(1, {"spec_json": json.dumps(spec)})
    submitted = []

    def fake(ledger, site, job, target, name, command, gpus, client=None):
        key = (target.job_id, target.task_index, target.step, name)
        assert ledger.evaluations.request(*key, str(target.checkpoint))
        eval_job = Table(ledger, "jobs").insert({"name": "eval", "site": "dev", "state": "RUNNING"})
        ledger.evaluations.submitted(*key, eval_job)
        submitted.append((target.step, name))
        return submit.Requested(target, name, eval_job)

    monkeypatch.setattr(submit, "submit_one", fake)
    list(submit.follow(ledger, load_site("dev"), 1))
    return submitted


def test_on_checkpoint_submits_newest_first_and_at_most_max_pending(ledger, monkeypatch):
    assert following(ledger, monkeypatch, max_pending=3) == [(100, "heldout"), (100, "ppl"), (50, "heldout")]
    assert following(ledger, monkeypatch, max_pending=3) == []  # three in flight
    for e in ledger.evaluations.of_job(1):  # they finish
        Table(ledger, "jobs").update(e["eval_job_id"], {"state": "COMPLETED"})
    assert following(ledger, monkeypatch, max_pending=3) == [(50, "ppl")]  # each pair once


def test_skip_superseded_leaves_checkpoints_older_than_the_newest_asked(ledger, monkeypatch):
    assert following(ledger, monkeypatch, max_pending=5, skip_superseded=True) == [(100, "heldout"), (100, "ppl")]


def test_a_checkpoint_directory_names_its_job_task_and_step(ledger, tmp_path):
    assert checkpoint_of(ledger, Path("/ck/step_00000050")) == (1, -1, 50)
    with pytest.raises(HpctrainError, match=r"^/ck/step_00000150: checkpoint of job 1 step 150 is deleted$"):
        checkpoint_of(ledger, Path("/ck/step_00000150"))
    with pytest.raises(HpctrainError, match=r"no job in the ledger wrote this checkpoint"):
        checkpoint_of(ledger, tmp_path / "step_00000050")


def test_a_relative_checkpoint_path_starting_with_a_dash_stays_a_value(ledger):
    from hpctrain.evaluate.__main__ import parse_args

    spec = eval_job_spec(ledger.jobs.known(1), Target(1, -1, 50, Path("-ck/step_00000050")), "heldout", None, gpus=1)
    args = parse_args(spec.command[3:])
    assert (args.checkpoint, args.evaluator, args.command) == (Path("-ck/step_00000050"), "heldout", [])


def test_on_checkpoint_with_nothing_to_evaluate_is_refused_at_submit():
    from hpctrain.config.loading import validate

    with pytest.raises(HpctrainError, match=r"s.toml: eval.on_checkpoint: nothing to evaluate with"):
        validate(JobSpec, {"name": "plain", "command": ["python", "t.py"], "eval": {"on_checkpoint": True}}, "s.toml")
