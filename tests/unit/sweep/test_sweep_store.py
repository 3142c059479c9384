"""Sweeps in the ledger: registration is idempotent, trial states follow their tasks, parameters reach the job
spec (the cluster tests run real ticks)."""

import errno
import fcntl
import json
import subprocess
import sys

import pytest

from hpctrain.config.job import JobSpec
from hpctrain.errors import ConfigError, HpctrainError
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.sweep import store
from hpctrain.sweep.spec import load_sweep_spec
from hpctrain.sweep.tick import _early_stop

SWEEP = """
name = "s1"
method = "random"
metric = "loss"
direction = "minimize"
max_trials = 4
[search]
lr = { type = "loguniform", low = 1e-4, high = 1e-1 }
[job]
name = "trial"
command = ["python", "train.py"]
"""


@pytest.fixture
def ledger(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        yield ledger


def test_register_twice_is_a_no_op_and_a_changed_spec_is_refused(ledger, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP)
    sweep, created = store.register(ledger, load_sweep_spec(path), path)
    assert created and sweep.job.name == "trial" and sweep.state == "ACTIVE"
    assert store.register(ledger, load_sweep_spec(path), path)[1] is False
    path.write_text(SWEEP.replace("max_trials = 4", "max_trials = 5"))
    with pytest.raises(HpctrainError, match="already exists with a different spec"):
        store.register(ledger, load_sweep_spec(path), path)


def test_inline_job_errors_name_the_key_under_job(ledger, tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.replace('command = ["python", "train.py"]', 'command = "train.py"'))
    with pytest.raises(ConfigError, match=r"s\.toml: job\.command: expected a list"):
        store.register(ledger, load_sweep_spec(path), path)


def test_a_job_file_is_read_relative_to_the_sweep_spec(ledger, tmp_path):
    (tmp_path / "job.toml").write_text('name = "filejob"\ncommand = ["true"]\n')
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.split("[job]")[0].replace('name = "s1"', 'name = "s2"\njob = "job.toml"'))
    assert store.register(ledger, load_sweep_spec(path), path)[0].job.name == "filejob"


@pytest.mark.parametrize("trial, task, expected", [
    ("new", None, "new"), ("pending", "PENDING", "pending"), ("pending", "REQUEUED", "pending"),
    ("pending", "RUNNING", "running"), ("running", "COMPLETED", "completed"), ("running", "FAILED", "failed"),
    ("running", "CANCELLED", "failed"), ("pruned", "CANCELLED", "pruned"), ("running", "OUT_OF_MEMORY", "failed"),
])
def test_trial_state_follows_its_task(trial, task, expected):
    assert store.trial_state(trial, task) == expected


def test_trial_parameters_override_hyperparameters_and_dotted_fields():
    spec = JobSpec.model_validate({"name": "t", "command": ["x"], "hyperparameters": {"lr": 0.1, "wd": 0.0}})
    applied = spec.with_params({"lr": 0.01, "parallel.micro_batch": 4})
    assert applied.hyperparameters == {"lr": 0.01, "wd": 0.0} and applied.parallel.micro_batch == 4
    with pytest.raises(ConfigError, match=r"\$HPCTRAIN_PARAMS: parallel\.micro_batch: expected an integer"):
        spec.with_params({"parallel.micro_batch": "four"})
    assert json.loads(json.dumps(spec.with_params({}).model_dump(mode="json"))) == spec.model_dump(mode="json")


def test_the_tick_lock_is_exclusive_and_a_long_wait_is_one_line(tmp_path):
    from hpctrain.sweep.tick import tick_lock

    ledger = tmp_path / "ledger.db"
    with tick_lock(ledger):
        with pytest.raises(HpctrainError, match=r"ledger\.db\.sweep-lock: another sweep tick has held the lock for over 0\.2s"):
            with tick_lock(ledger, wait_s=0.2):
                pass
    with tick_lock(ledger, wait_s=0.2):  # released
        pass


@pytest.mark.parametrize("task, expected", [("PENDING", "running"), ("RUNNING", "running"), ("FAILED", "failed"),
                                            ("COMPLETED", "completed")])
def test_a_trial_that_reports_runs_whatever_accounting_says_yet(task, expected):
    """sacct can lag, and list an array's last task under the array's own id, still PENDING, while it runs:
    a trial with metric values is running, so that early stopping judges it."""
    assert store.trial_state("pending", task, reporting=True) == expected


class RecordedCancels(SlurmClient):
    def __init__(self) -> None:
        super().__init__()
        self.cancelled: list[str] = []

    def scancel(self, job_ids, signal=None, batch_only=False, harmless=None):
        assert harmless is not None and harmless.match(
            "scancel: error: Kill job error on job id 7_1: Job/step already completing or completed")
        self.cancelled += job_ids


def test_a_pruned_trial_whose_task_accounting_shows_unfinished_is_cancelled_again(ledger, tmp_path):
    """A cancel lost on a busy controller must not leave a pruned trial holding its GPUs: each tick cancels
    again the tasks of pruned trials that accounting still shows unfinished, and no other."""
    path = tmp_path / "s.toml"
    path.write_text(SWEEP.replace("[search]", '[early_stopping]\nrule = "median"\n[search]'))
    sweep = store.register(ledger, load_sweep_spec(path), path)[0]
    rows = [{"number": n, "state": state, "task_state": task, "slurm_job_id": "7", "task_index": n}
            for n, (state, task) in enumerate([("pruned", "RUNNING"), ("pruned", "CANCELLED"), ("pruned", "PENDING"),
                                               ("completed", "COMPLETED"), ("pruned", None)])]
    client = RecordedCancels()
    assert _early_stop(ledger, client, sweep, rows) == {}
    assert client.cancelled == ["7_0", "7_2"]


HOLDER = """
import sys, time
from pathlib import Path
from hpctrain.sweep.tick import tick_lock
with tick_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
"""


def test_the_tick_lock_is_a_posix_record_lock_that_goes_with_its_process(tmp_path):
    """SQLite's kind of lock, which the ledger's storage check makes sure other hosts see (flock stays on each host
    on NFS mounted local_lock=flock): another process's fcntl lock is refused, its flock is not."""
    from hpctrain.sweep.tick import tick_lock

    ledger = tmp_path / "ledger.db"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ledger)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with open(tmp_path / "ledger.db.sweep-lock", "r+b") as fh:
            with pytest.raises(OSError) as refused:
                fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            assert refused.value.errno in (errno.EACCES, errno.EAGAIN)
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
        with pytest.raises(HpctrainError, match="another sweep tick has held the lock for over 0.3s"):
            with tick_lock(ledger, wait_s=0.3):
                pass
    finally:
        holder.kill()
        holder.wait()
    with tick_lock(ledger, wait_s=5):  # killed, its lock is gone with it
        pass
