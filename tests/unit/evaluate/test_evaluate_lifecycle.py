"""An evaluation request's lifecycle without Slurm (requested -> submitted -> done | failed | expired), each job's
submission failure its own, and the evaluation job's inputs (the jobs on the cluster:
tests/cluster/test_evaluate_cluster.py)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.config.job import JobSpec
from hpctrain.errors import ConfigError
from hpctrain.evaluate import submit
from hpctrain.evaluate.run import Target
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.submit import Submitter
from hpctrain.submit.submitter import Submission

from helpers.ledger import traced
from helpers.paths import REPO

BASE = tomllib.loads((REPO / "scripts" / "examples" / "gpt-tiny.toml").read_text())
TARGET = Target(1, -1, 100, Path("/ck/step_00000100"))


def spec_data(**eval_policy) -> dict:
    return {**BASE, "eval": {"index": "/d/held-out.json", "evaluators": {"ppl": ["python", "ppl.py"]}, **eval_policy}}


def add_job(ledger: Ledger, data: dict, state: str = "RUNNING") -> int:
    job = Table(ledger, "jobs").insert({"name": data["name"], "site": "dev", "state": state,
                                        "slurm_job_id": f"9{len(Table(ledger, 'jobs').rows())}",
                                        "spec_json": json.dumps(data)})
    ledger.checkpoints.record({"job_id": job, "task_index": -1, "step": 100, "path": f"/ck/{job}/step_00000100",
                               "state": "committed", "created_at": 1.0})
    return job


class FakeClient:
    """Slurm as `settle` asks it: which job carries a name."""

    def __init__(self, names: dict[str, str]):
        self.names = names

    def find_by_name(self, name: str, since: float) -> str | None:
        return self.names.get(name)


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        yield ledger


@pytest.fixture
def fake_sbatch(monkeypatch):
    """Submitter.submit that records the job (the request linked in its transaction) and has Slurm take it, or
    refuses a spec whose name starts with "bad" as submit refuses a secret missing from the environment."""
    names: list[str] = []

    def fake(self, spec, where, on_record=None, **_):
        if spec.name.startswith("bad"):
            raise ConfigError(f"{where}: env.TOKEN: marked secret but not set in the submitting environment")
        with self.ledger.transaction():
            job_id = self.ledger.jobs.record({"name": spec.name, "site": "dev"})
            on_record(job_id, None)
        self.ledger.jobs.submitted(job_id, str(1000 + job_id))
        names.append(spec.name)
        return Submission(None, [], [job_id], [str(1000 + job_id)])  # type: ignore[arg-type]

    monkeypatch.setattr(Submitter, "submit", fake)
    return names


def test_the_evaluation_time_limit_is_the_specs_own_and_bounded(ledger):
    job = ledger.jobs.known(add_job(ledger, JobSpec.model_validate(spec_data(time="02:00:00")).redacted()))
    assert submit.eval_job_spec(job, TARGET, "ppl", ["python", "ppl.py"], 1).resources.time == 7200
    old = ledger.jobs.known(add_job(ledger, spec_data()))  # recorded before [eval] time: 30 minutes
    assert submit.eval_job_spec(old, TARGET, "ppl", ["python", "ppl.py"], 1).resources.time == 1800
    with pytest.raises(Exception, match=r"eval\.time"):
        JobSpec.model_validate(spec_data(time="8-00:00:00"))


def test_a_request_whose_submitter_died_is_found_in_slurm_by_its_name_or_expires(ledger):
    """Killed after the ledger job was recorded: its job is found by the request's name (submitted, the ledger job
    given its Slurm id) or Slurm never got it (expired, its ledger job SUBMIT_FAILED); killed before: expired."""
    job = add_job(ledger, spec_data())
    for step, name in ((1, "gpt-eval-a"), (2, "gpt-eval-b"), (3, "gpt-eval-c")):
        assert ledger.evaluations.request(job, -1, step, "ppl", "/ck", name)
        if step < 3:
            ledger.evaluations.linked(job, -1, step, "ppl", ledger.jobs.record({"name": name, "site": "dev"}))
    client = FakeClient({"gpt-eval-a": "777"})
    for row in ledger.evaluations.undecided():
        submit.settle(ledger, client, row)  # type: ignore[arg-type]
    rows = {e["step"]: e for e in ledger.evaluations.of_job(job)}
    assert [rows[s]["state"] for s in (1, 2, 3)] == ["submitted", "expired", "expired"]
    assert ledger.jobs.known(rows[1]["eval_job_id"])["slurm_job_id"] == "777"
    assert ledger.jobs.known(rows[2]["eval_job_id"])["state"] == "SUBMIT_FAILED"
    # An expired request is asked for again; a submitted one is not.
    assert ledger.evaluations.request(job, -1, 2, "ppl", "/ck", "gpt-eval-d", again=("expired",))
    assert not ledger.evaluations.request(job, -1, 1, "ppl", "/ck", "gpt-eval-e", again=("expired",))


def test_one_jobs_failing_submission_is_its_own_and_the_others_go_on(ledger, fake_sbatch):
    """Reconcile's on_checkpoint pass: the job whose evaluation cannot be submitted gets its request failed with the
    reason, in one line; the job after it gets its evaluation."""
    bad = add_job(ledger, {**spec_data(on_checkpoint=True), "name": "bad"})
    good = add_job(ledger, {**spec_data(on_checkpoint=True), "name": "good"})
    submitted, failures = submit.follow_all(ledger, load_site("dev"), 0.0)
    assert failures == [f"job {bad}: step 100 (heldout): env.TOKEN: marked secret but not set in the submitting "
                        "environment"]
    assert [(r.target.job_id, r.evaluator) for r in submitted] == [(good, "heldout"), (good, "ppl")]
    (row,) = ledger.evaluations.of_job(bad)  # its next evaluator waits for the next pass
    assert row["state"] == "failed" and row["error"] == failures[0].split(": ", 1)[1]
    # A failed one is not retried behind the user's back: the next pass tries the other evaluator, then none.
    assert submit.follow_all(ledger, load_site("dev"), 0.0)[1] == [failures[0].replace("heldout", "ppl")]
    assert submit.follow_all(ledger, load_site("dev"), 0.0) == ([], [])


def test_a_failed_evaluation_is_asked_again_with_retry_and_promote_says_so(ledger, fake_sbatch):
    from hpctrain.registry.gate import Gate

    job = add_job(ledger, spec_data())
    (first,) = submit.request(ledger, load_site("dev"), job, [100], False, ["ppl"])
    ledger.evaluations.failed(job, -1, 100, "ppl", "evaluation job 2 (slurm 1002) ended FAILED without a result", 5.0)
    version = {"job_id": job, "task_index": -1, "step": 100}
    hint = Gate("ppl", "ppl", "min").how_to_evaluate(ledger, version)  # type: ignore[arg-type]
    assert hint.endswith(f"ask again: hpctrain eval {job} --step 100 --evaluator ppl --retry")
    (again,) = submit.request(ledger, load_site("dev"), job, [100], False, ["ppl"])
    assert again.eval_job_id is None and again.before == "failed"  # without --retry: asked for before
    (retried,) = submit.request(ledger, load_site("dev"), job, None, False, [], retry=True)  # every failed one
    assert retried.eval_job_id not in (None, first.eval_job_id)
    assert ledger.evaluations.get(job, -1, 100, "ppl")["state"] == "submitted"
    assert len(fake_sbatch) == 2 and len(set(fake_sbatch)) == 2  # each submission under a name of its own


def test_the_evaluation_job_keeps_the_training_specs_resolved_paths(ledger, monkeypatch):
    """A path resolved at submit to hold a literal '$HOME' (and '~') stays as it is: never expanded again."""
    monkeypatch.setenv("HOME", "/root")
    data = {**spec_data(index="/d/lit-$HOME/held-out.json"), "workdir": "/w/lit-$HOME/~x"}
    job = ledger.jobs.known(add_job(ledger, data))
    spec = submit.eval_job_spec(job, TARGET, "ppl", ["python", "ppl.py"], 1)
    assert (str(spec.workdir), str(spec.eval.index)) == ("/w/lit-$HOME/~x", "/d/lit-$HOME/held-out.json")
    assert str(submit.job_spec(job).workdir) == "/w/lit-$HOME/~x"


@pytest.mark.parametrize("evaluator, says", [
    (["python", "x" * 200_000], r"eval\.evaluators\.ppl\[1\]: 200001 bytes with its NUL, more than the 131072"),
    (["python", "a\ud800b"], r"eval\.evaluators\.ppl\[1\]: not UTF-8 text: a lone surrogate at character 1"),
    ([], r"eval\.evaluators\.ppl: expected the program to run as the first item"),
])
def test_an_evaluator_that_cannot_run_is_refused_in_one_line(tmp_path, evaluator, says):
    """At submit (the spec as JSON: TOML cannot hold a lone surrogate), and at `hpctrain eval` for a spec recorded
    before the check: one line, no request kept."""
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec_data(evaluators={"ppl": evaluator})))
    with pytest.raises(ConfigError, match=says) as refused:
        load_job_spec(path)
    assert "\n" not in str(refused.value)
    with Ledger(tmp_path / "ledger.db") as ledger:
        job = ledger.jobs.known(add_job(ledger, spec_data(evaluators={"ppl": evaluator})))
        with pytest.raises(ConfigError, match=says):
            submit.submit_one(ledger, load_site("dev"), job, TARGET, "ppl", evaluator, 1)
        assert ledger.evaluations.of_job(job["id"]) == []


def test_reconcile_finds_the_jobs_it_follows_without_reading_the_others(ledger, monkeypatch):
    """Among many jobs that ended lately, the few whose spec says on_checkpoint (ended or active) are found through
    an index: the SQLite work does not grow with the others (each would be read, its spec parsed)."""
    others = 500
    now = 1e9
    ledger.db.conn.executemany(
        "INSERT INTO jobs (name, site, state, slurm_job_id, spec_json, ended_at, submitted_at, updated_at) "
        "VALUES (?, 'dev', 'COMPLETED', ?, ?, ?, ?, ?)",
        [(f"other{i}", str(i), json.dumps(spec_data()), now - i, now - i - 60, now - i) for i in range(others)])
    ended = add_job(ledger, {**spec_data(on_checkpoint=True), "name": "ended"}, state="COMPLETED")
    ledger.db.execute("UPDATE jobs SET ended_at = ? WHERE id = ?", [now - 10, ended])
    old = add_job(ledger, {**spec_data(on_checkpoint=True), "name": "old"}, state="COMPLETED")
    ledger.db.execute("UPDATE jobs SET ended_at = ? WHERE id = ?", [now - 10 * 86400, old])
    active = add_job(ledger, {**spec_data(on_checkpoint=True), "name": "active"})
    add_job(ledger, {**spec_data(on_checkpoint=False), "name": "off"})
    ledger.db.conn.commit()
    followed: list[int] = []
    monkeypatch.setattr(submit, "follow", lambda ledger, site, job_id: followed.append(job_id) or [])
    result: list[object] = []
    _, steps = traced(ledger, lambda: result.append(submit.follow_all(ledger, load_site("dev"), now - 86400)))
    assert result == [([], [])] and followed == [active, ended]
    assert steps < others  # reading each ended job takes several steps
