"""hpctrain's submitit executor without the cluster: parameters to a job spec, and the compute-side runner of a
pickled call (results where submitit reads them, the stop notice before, during and between steps)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission, pickle_load

from hpctrain.errors import ConfigError
from hpctrain.contract import JobPaths
from hpctrain.submit.executor import Executor

from helpers.executor import Loop, add
from helpers.waiting import wait_until

JOB_ID = "77"


def executor() -> Executor:
    return Executor(site="dev")


def test_submitit_parameters_become_the_job_spec():
    ex = executor()
    ex.update_parameters(timeout_min=90, mem_gb=2, name="train <fast>", nodes=2, tasks_per_node=2,
                         gpus_per_node=2, account="auto", preemptible=True, setup=["module load cuda"],
                         env={"WANDB_MODE": "offline"})
    spec = ex.job_spec(1)
    r = spec.resources
    assert (spec.name, r.time, r.mem, r.nodes, r.ntasks_per_node, r.gpus_per_node) == ("train--fast-", 5400, 2048, 2, 2, 2)
    assert (r.account, r.preemptible, spec.setup, spec.env["WANDB_MODE"].value) == \
        ("auto", True, ["module load cuda"], "offline")
    assert spec.command[-3:] == ["-u", "-m", "hpctrain.runtime.function"] and spec.array is None
    ex = executor()
    ex.update_parameters(time="02:00:00", mem="512MB", gpus_per_node=4, array_parallelism=3)
    many = ex.job_spec(10)
    assert (many.resources.time, many.resources.mem, many.array.count, many.array.throttle) == (7200, 512, 10, 3)
    assert many.resources.ntasks_per_node == 1  # submitit's default: one task, whatever the GPUs
    ex.update_parameters(dependency="afterany:123:456_7")
    assert ex.job_spec(1).dependency.model_dump(include={"kind", "after"}) == {"kind": "afterany",
                                                                             "after": ["123", "456_7"]}


@pytest.mark.parametrize("params, message", [
    ({"exclude": "n1"}, "'exclude' is not supported by hpctrain's executor"),
    ({"signal_delay_s": 60}, "'signal_delay_s' is not supported"),
])
def test_parameters_hpctrain_has_no_place_for_are_refused_by_name(params, message):
    with pytest.raises(ConfigError, match=message):
        executor().update_parameters(**params)


def test_a_bad_value_is_one_line_naming_the_field():
    ex = executor()
    ex.update_parameters(nodes=0)
    with pytest.raises(ConfigError) as err:
        ex.job_spec(1)
    assert "executor parameters" in str(err.value) and "resources.nodes" in str(err.value)


def runner(job_dir: Path, delayed: DelayedSubmission, **env: str) -> subprocess.Popen:
    call = JobPaths(job_dir).call(0)
    call.parent.mkdir(parents=True, exist_ok=True)
    delayed.dump(call)
    environ = {**os.environ, "HPCTRAIN_JOB_DIR": str(job_dir), "SLURM_JOB_ID": JOB_ID, "SLURM_PROCID": "0",
               "HPCTRAIN_NOTICE_FILE": str(job_dir / "notice"), **env}
    return subprocess.Popen([sys.executable, "-m", "hpctrain.runtime.function"], env=environ, cwd=job_dir,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def outcome(job_dir: Path) -> tuple[str, object] | None:
    path = job_dir / f"{JOB_ID}_0_result.pkl"  # submitit's name for it
    return pickle_load(path) if path.exists() else None


def test_a_call_returns_its_result_or_its_traceback(tmp_path):
    ok = runner(tmp_path / "ok", DelayedSubmission(add, 1, 2))
    failed = runner(tmp_path / "failed", DelayedSubmission(add, 2, 2))
    assert ok.wait(60) == 0 and outcome(tmp_path / "ok") == ("success", 3)
    assert failed.wait(60) == 1
    kind, trace = outcome(tmp_path / "failed")
    assert kind == "error" and "ValueError: two is refused" in trace


def lines(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def stop_after(proc: subprocess.Popen, progress: Path, steps: int) -> None:
    wait_until(lambda: len(lines(progress)) >= steps, 60, 0.05, f"{steps} steps")
    proc.send_signal(signal.SIGUSR2)
    assert proc.wait(60) == 0, proc.stdout.read()


def test_a_guarded_call_stops_at_its_step_boundary_and_resumes_from_its_checkpoint(tmp_path):
    """USR2 mid-run: the call finishes its step, its checkpoint() is pickled in place of the call, no result is
    written; run again, it resumes there: every step ran exactly once."""
    progress = tmp_path / "progress"
    proc = runner(tmp_path, DelayedSubmission(Loop(60, progress, step_s=0.05)))
    stop_after(proc, progress, 5)
    assert outcome(tmp_path) is None
    saved = DelayedSubmission.load(JobPaths(tmp_path).call(0)).function
    assert 5 <= saved.step == len(lines(progress)) < 60
    again = runner(tmp_path, DelayedSubmission.load(JobPaths(tmp_path).call(0)))
    assert again.wait(60) == 0
    assert outcome(tmp_path) == ("success", {"step": 60, "total": 60 * 61 // 2, "starts": [0, saved.step]})
    assert lines(progress) == list(range(1, 61))


def test_an_unguarded_checkpointable_is_checkpointed_at_once_as_submitit_does(tmp_path):
    """A call that never asks should_stop(): the notice interrupts it where it is, almost always in the middle of
    a step (the step's sleep), which then runs again."""
    progress = tmp_path / "progress"
    proc = runner(tmp_path, DelayedSubmission(Loop(60, progress, step_s=0.05, guarded=False)))
    stop_after(proc, progress, 5)
    saved = DelayedSubmission.load(JobPaths(tmp_path).call(0)).function
    assert saved.step in (len(lines(progress)) - 1, len(lines(progress)))
    assert outcome(tmp_path) is None


def test_a_notice_before_the_call_starts_requeues_it_untouched(tmp_path):
    progress = tmp_path / "progress"
    tmp_path.joinpath("notice").write_text("USR2\n")
    proc = runner(tmp_path, DelayedSubmission(Loop(10, progress)))
    assert proc.wait(60) == 0
    assert not progress.exists() and outcome(tmp_path) is None
    assert DelayedSubmission.load(JobPaths(tmp_path).call(0)).function.step == 0


def test_requeue_without_a_notice_is_an_error(tmp_path):
    from hpctrain.runtime.function import requeue

    proc = runner(tmp_path, DelayedSubmission(requeue))
    assert proc.wait(60) == 1
    assert outcome(tmp_path) == ("error", "requeue() was called without a stop notice (see should_stop())")


def test_should_stop_is_false_outside_a_submitted_call():
    from hpctrain.runtime.function import should_stop

    assert should_stop() is False


def test_waiting_outlives_a_slurm_outage(tmp_path, monkeypatch, caplog):
    """As submitit's watcher: a poll that cannot reach Slurm warns and leaves the states as they were."""
    from hpctrain.errors import SlurmError
    from hpctrain.jobs.poll import Poller
    from hpctrain.ledger import Ledger
    from hpctrain.slurm.client import SlurmClient
    from hpctrain.submit.executor import LedgerWatcher

    def down(self):
        raise SlurmError("sacct: error: Problem talking to the database")

    monkeypatch.setattr(Poller, "refresh", down)
    watcher, site = LedgerWatcher(), executor().site
    with Ledger(tmp_path / "ledger.db") as ledger:
        watcher.track("123", ledger, SlurmClient.for_site(site), site.name)
        watcher.update()
        assert watcher.get_state("123", mode="cache") == "UNKNOWN" and not watcher.is_done("123", mode="cache")
    assert "Problem talking to the database" in caplog.text
