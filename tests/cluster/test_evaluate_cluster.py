"""`hpctrain eval` on the dev cluster: evaluation jobs on a trained job's committed checkpoints, each once, their
values (or errors) in the ledger, in `show` and in `metrics`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.contract import EVAL_LOSS
from hpctrain.ledger import Ledger
from hpctrain.ledger.evaluations import OPEN
from hpctrain.ledger.journal import Journal
from hpctrain.submit import Submitter

from helpers.cli import run_cli
from helpers.cluster import finish
from helpers.lanes import lanes
from helpers.paths import REPO
from helpers.registry import record_checkpoint
from helpers.train import TINY_MODEL, pack_text_dataset, trainer_spec

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@lanes("26.05", why="evaluation jobs are sbatch jobs like any other; the releases differ in requeue, run here")
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
    newest = run_cli("eval", str(tmp_path / "ck" / "step_00000006"), "--evaluator", "ppl", "--evaluator", "broken",
                     env=env)  # a checkpoint by its directory
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

    # From run to model: of the two checkpoints, the one the evaluation jobs found better becomes production
    # through the gate; the other is refused with both numbers.
    heldout = {step: json.loads(rows[(step, "heldout")]["metrics_json"])[EVAL_LOSS] for step in (3, 6)}
    for step in (3, 6):
        assert run_cli("model", "register", "gpt", str(job), "--step", str(step), env=env).returncode == 0
    better, worse = (2, 1) if heldout[6] <= heldout[3] else (1, 2)
    promoted = run_cli("model", "promote", "gpt", str(better), "--alias", "production", env=env)
    assert promoted.returncode == 0, promoted.stderr
    refused = run_cli("model", "promote", "gpt", str(worse), "--alias", "production", env=env)
    assert refused.returncode == 2 and f"worse than gpt@production (gpt:{better})" in refused.stderr
    assert f"{heldout[3 * worse]:.6g}" in refused.stderr and f"{heldout[3 * better]:.6g}" in refused.stderr


@lanes("24.11", why="24.11 is the release this once failed on alone (its preemption records)")
@pytest.mark.timeout(1800)  # its waits catch hangs only: 4 ranks restart in about 4 min at CI's load
def test_on_checkpoint_evaluates_every_checkpoint_once_across_preemptions(dev_cluster, isolated_ledger, tmp_path):
    """A preemptible job with `[eval] on_checkpoint`, driven by reconciles as cron would, is preempted twice by QOS
    high jobs, and an evaluation job running then with it (requeued by Slurm, it evaluates again from the start).
    Every committed checkpoint ends with exactly one result, of its own step. The evaluator waits for a file the test
    makes once both preemptions have ended every job, so that one is caught running at any load."""
    from hpctrain.config.job import JobSpec
    from hpctrain.evaluate.submit import follow_all, unasked
    from hpctrain.jobs.reconcile import reconcile
    from hpctrain.slurm import SlurmClient
    from hpctrain.slurm.states import TERMINAL

    from helpers.cluster import HIGH
    from helpers.waiting import wait_until

    index = pack_text_dataset(tmp_path / "data", TINY_MODEL["seq_len"], count=400, shard_bytes=4096).path
    gate = tmp_path / "gate"  # opened once the second preemption is seen: until then every evaluation runs on
    slow = (f"import json, os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.2)\ne = os.environ; "
            "json.dump({'step': int(e['HPCTRAIN_EVAL_STEP'])}, open(e['HPCTRAIN_EVAL_OUTPUT'], 'w'))")
    spec_path = tmp_path / "spec.toml"
    spec_path.write_text(
        trainer_spec("gpt-followed", seed=7, index=index, ckpt=tmp_path / "ck", every_steps=10, steps=60,
                     resources={"gpus_per_node": 4, "mem": "2G", "time": "00:15:00", "account": "teama",
                                "preemptible": True})
        + "keep_last = 20\n\n[eval]\non_checkpoint = true\nmax_pending = 2\n\n[eval.evaluators]\n"
        + f"slow = {json.dumps([sys.executable, '-c', slow])}\n")
    site = load_site("dev")
    client = SlurmClient.for_site(site)
    with Ledger(isolated_ledger) as ledger:
        job = Submitter(site, ledger).submit(load_job_spec(spec_path), spec_path).ledger_ids[0]

        def tick() -> None:  # what cron's `hpctrain reconcile` does
            reconcile(ledger, client, site.name)
            follow_all(ledger, site, 0.0)

        def newest() -> int:
            return max((c["step"] for c in ledger.checkpoints.of_job(job) if c["state"] == "committed"), default=0)

        def evaluations_running() -> bool:
            jobs = [e["eval_job_id"] for e in ledger.evaluations.of_job(job) if e["eval_job_id"]]
            return any(ledger.jobs.known(i)["state"] == "RUNNING" for i in jobs)

        def ready(after: int, evaluating: bool) -> bool:
            """The job runs past checkpoint ``after`` (and, with ``evaluating``, an evaluation job runs too)."""
            tick()
            running = evaluations_running()
            return ledger.jobs.known(job)["state"] == "RUNNING" and newest() > after and (running or not evaluating)

        def state() -> str:
            """What a wait that ran out saw: the job's row, runs and events, and the checkpoints and evaluations."""
            row = ledger.jobs.known(job)
            return json.dumps({"job": {k: row[k] for k in ("slurm_job_id", "state", "submitted_at")},
                               "runs": [(a["attempt"], a["state"], a["node_list"]) for a in ledger.attempts.of_job(job)],
                               "events": [(e["kind"], e["message"]) for e in ledger.events.of_job(job)][-8:],
                               "checkpoints": [(c["step"], c["state"]) for c in ledger.checkpoints.of_job(job)],
                               "evaluations": [(e["step"], e["state"], e["eval_job_id"])
                                               for e in ledger.evaluations.of_job(job)]})

        seen = 0
        for k, evaluating in ((1, False), (2, True)):
            wait_until(lambda: ready(seen, evaluating), 600, 0.5, f"the job to run on past step {seen} ({k})", state)
            seen = newest()
            Submitter(site, ledger).submit(JobSpec.model_validate(HIGH), "<high>")
            wait_until(lambda: (tick(), ledger.jobs.known(job)["state"])[1] != "RUNNING", 600, 0.5, f"preemption {k}",
                       state)
        wait_until(lambda: (tick(), not evaluations_running())[1], 600, 0.5, "the evaluation jobs' preemption", state)
        gate.touch()

        def all_done() -> bool:
            tick()
            return (ledger.jobs.known(job)["state"] in TERMINAL and not unasked(ledger, job)
                    and all(e["state"] not in OPEN for e in ledger.evaluations.of_job(job)))

        wait_until(all_done, 900, 2.0, "the job and every evaluation to finish", state)
        assert ledger.jobs.known(job)["state"] == "COMPLETED"
        preempted = [a for a in ledger.attempts.of_job(job) if a["cause"] == "preemption"]
        committed = sorted(c["step"] for c in ledger.checkpoints.of_job(job) if c["state"] == "committed")
        rows = ledger.evaluations.of_job(job)
        eval_runs = [len(ledger.attempts.of_job(r["eval_job_id"])) for r in rows]
    assert len(preempted) == 2
    assert set(range(10, 61, 10)) <= set(committed)  # and the step each preempted run stopped at
    assert [(r["step"], r["evaluator"], r["state"]) for r in rows] == [(s, "slow", "done") for s in committed]
    assert [json.loads(r["metrics_json"]) for r in rows] == [{"step": s} for s in committed]
    assert max(eval_runs) >= 2  # an evaluation job preempted too, and run again



# The lifecycle of a request (issue 56): a ledger job made to look trained (no training run: one short evaluation
# job each), its checkpoints in the ledger only, so each evaluation job fails verification fast or is cancelled.
KILL_AT = {  # where a submission dies (os._exit, as a cron `timeout` or scrontab limit kills it)
    "commit": "Submitter.submit = lambda *a, **k: os._exit(9)",
    "sbatch": "old = SlurmClient.sbatch\nSlurmClient.sbatch = lambda *a, **k: (old(*a, **k), os._exit(9))[0]",
    "job id": "old = Jobs.submitted\nJobs.submitted = lambda *a, **k: (old(*a, **k), os._exit(9))[0]",
}


def trained_job(ledger, tmp_path, name="evalcycle", steps=(1,), secret=False, real=False, **eval_policy) -> int:
    """A finished job with committed checkpoints at ``steps``: rows only, or (``real``) checkpoints that verify."""
    from hpctrain.config.job import JobSpec
    from hpctrain.ledger.table import Table

    spec = JobSpec.model_validate({
        "name": name, "command": ["true"], "launcher": "none", "resources": {"mem": "100M", "time": "5"},
        "env": {"EVAL_TOKEN": {"secret": True}} if secret else {},
        "eval": {"on_checkpoint": True, "evaluators": {"e": [sys.executable, "-c", "pass"]}, **eval_policy}})
    job = Table(ledger, "jobs").insert({"name": name, "site": "dev", "state": "COMPLETED", "ended_at": 1.0,
                                        "spec_json": json.dumps(spec.redacted())})
    for step in steps:
        if real:
            record_checkpoint(ledger, job, -1, tmp_path / name, step)
            continue
        ledger.checkpoints.record({"job_id": job, "task_index": -1, "step": step,
                                   "path": str(tmp_path / name / f"step_{step:08d}"), "state": "committed",
                                   "created_at": 1.0})
    return job


def slurm_jobs_named(name: str) -> set[str]:
    listed = subprocess.run(["squeue", "-h", "--me", "-t", "all", "--name", name, "-o", "%i"], capture_output=True,
                            text=True, check=True).stdout.split()
    counted = subprocess.run(["sacct", "-X", "-n", "-P", "--name", name, "-S", "now-1days", "-o", "JobID"],
                             capture_output=True, text=True, check=True).stdout.split()
    return set(listed) | set(counted)


def test_an_evaluation_ended_without_a_result_fails_and_is_asked_again(dev_cluster, isolated_ledger, tmp_path):
    """Its job cancelled (as TIMEOUT, an OOM kill or a node failure end it): reconcile fails the request, `eval`
    says how to ask again, `eval --retry` does, and `[eval] time` is the job's limit (issue 56, item 2)."""
    from hpctrain.jobs.reconcile import reconcile
    from hpctrain.slurm import SlurmClient

    from helpers.waiting import wait_until

    env = {"HPCTRAIN_LEDGER": str(isolated_ledger)}
    slow = {"e": [sys.executable, "-c", "import time; time.sleep(600)"]}  # still running when cancelled, at any load
    with Ledger(isolated_ledger) as ledger:
        job = trained_job(ledger, tmp_path, time="2", real=True, evaluators=slow)
    first = run_cli("eval", str(job), "--step", "1", "--evaluator", "e", env=env)
    assert first.returncode == 0, first.stderr
    with Ledger(isolated_ledger) as ledger:
        eval_job = ledger.jobs.known(ledger.evaluations.get(job, -1, 1, "e")["eval_job_id"])
        assert run_cli("cancel", str(eval_job["id"]), env=env).returncode == 0
        client = SlurmClient.for_site(load_site("dev"))
        wait_until(lambda: (reconcile(ledger, client, "dev"), ledger.evaluations.get(job, -1, 1, "e")["state"])[1]
                   != "submitted", 120, 1.0, "the cancelled evaluation to be failed")
        row = ledger.evaluations.get(job, -1, 1, "e")
    assert row["state"] == "failed" and "ended CANCELLED without a result" in row["error"], row
    again = run_cli("eval", str(job), "--step", "1", "--evaluator", "e", env=env)
    assert f"hpctrain eval {job} --step 1 --evaluator e --retry" in again.stdout, again.stdout
    retried = run_cli("eval", str(job), "--retry", env=env)
    assert retried.returncode == 0 and "step 1 with e: submitted" in retried.stdout, retried.stderr
    with Ledger(isolated_ledger) as ledger:
        row = ledger.evaluations.get(job, -1, 1, "e")
        assert row["state"] == "submitted" and row["eval_job_id"] != eval_job["id"]
        key = row["submission_key"]
    limit = subprocess.run(["squeue", "-h", "-t", "all", "--name", key, "-o", "%l"], capture_output=True,
                           text=True).stdout.split()
    assert limit in (["2:00"], []), limit  # [eval] time = 2 minutes (or it has ended and left the queue already)


@lanes(why="the refusal is hpctrain's own, before any Slurm call that differs between releases")
def test_one_jobs_evaluation_that_cannot_be_submitted_leaves_the_others(dev_cluster, isolated_ledger, tmp_path,
                                                                       monkeypatch):
    """Reconcile from cron without the secret one job's spec needs: that job's request fails with the reason, the
    other job's evaluation is submitted, and reconcile exits 1 with one line (issue 56, item 3)."""
    monkeypatch.delenv("EVAL_TOKEN", raising=False)
    with Ledger(isolated_ledger) as ledger:
        broken = trained_job(ledger, tmp_path, "needs-secret", secret=True)
        healthy = trained_job(ledger, tmp_path, "healthy")
        for job in (broken, healthy):  # reconcile follows the jobs that ended lately
            ledger.jobs.set_state(job, "COMPLETED", ended_at=time.time())
    done = run_cli("reconcile", env={"HPCTRAIN_LEDGER": str(isolated_ledger)})
    assert done.returncode == 1, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"hpctrain: error: evaluations of job {broken}: step 1 (e): env.EVAL_TOKEN")
    assert f"job {healthy} step 1: evaluating with e" in done.stdout
    with Ledger(isolated_ledger) as ledger:
        assert ledger.evaluations.get(broken, -1, 1, "e")["state"] == "failed"
        assert ledger.evaluations.get(healthy, -1, 1, "e")["state"] == "submitted"


@lanes("24.11", why="the submission is found again by its job name through squeue, alike on 24.11 and 26.05")
def test_an_eval_killed_at_any_step_or_run_twice_at_once_submits_each_evaluation_once(dev_cluster, isolated_ledger,
                                                                                     tmp_path):
    """`hpctrain eval` killed after the request's commit, after sbatch, after the job id is recorded; then run again:
    every request is decided, with exactly one evaluation job in Slurm. Two at once on one request: one job
    (issue 56, item 4)."""
    import textwrap

    env = {"HPCTRAIN_LEDGER": str(isolated_ledger)}
    with Ledger(isolated_ledger) as ledger:
        job = trained_job(ledger, tmp_path, steps=(1, 2, 3, 4))
    for step, kill in zip((1, 2, 3), KILL_AT.values()):
        script = textwrap.dedent("""
            import os, sys
            from hpctrain.cli import main
            from hpctrain.ledger.jobs import Jobs
            from hpctrain.slurm.client import SlurmClient
            from hpctrain.submit import Submitter
        """) + kill + f"\nsys.argv = ['hpctrain', 'eval', '{job}', '--step', '{step}']\nmain()\n"
        died = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env={**os.environ, **env})
        assert died.returncode == 9, died.stderr
    together = [subprocess.Popen([sys.executable, "-m", "hpctrain", "eval", str(job), "--step", "4"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env})
                for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in together]
    assert all(p.returncode == 0 for p in together), outs
    assert sum("submitted, ledger id" in out for out, _ in outs) == 1, outs
    again = run_cli("eval", str(job), "--all", env=env)
    assert again.returncode == 0, again.stderr
    with Ledger(isolated_ledger) as ledger:
        rows = {e["step"]: e for e in ledger.evaluations.of_job(job)}
    assert sorted(rows) == [1, 2, 3, 4]
    assert all(r["state"] != "requested" for r in rows.values()), rows
    assert {s: len(slurm_jobs_named(r["submission_key"])) for s, r in rows.items()} == {1: 1, 2: 1, 3: 1, 4: 1}
