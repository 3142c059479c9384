"""Values a user could type that once crashed or stuck hpctrain: each now gives a job, or one line naming
the file and key with the value shortened, and leaves no ledger row in a non-final state. Those that need a
real submission are in tests/cluster/test_typed_input_cluster.py."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.slurm.client import complaint
from hpctrain.submit.lineage import entry_point

from helpers.bad_input import (ONE_LINER, assert_ledger_untouched, assert_user_error, examples, invoke, one_error_line,
                               spec_file, string_leaves, typed_text, with_value, write_config)
from helpers.cli import run_cli


def test_an_argument_longer_than_a_file_name_is_no_entry_point(tmp_path):
    assert entry_point(["python", "-c", ONE_LINER], tmp_path) is None
    assert entry_point(["bash", "x" * 300], tmp_path) is None
    script = tmp_path / "train.py"
    script.write_text("")
    assert entry_point(["python3", "train.py", "y" * 300], tmp_path) == script


def test_a_nul_byte_in_a_secret_or_an_argument_is_one_line_and_no_row(tmp_path, isolated_ledger):
    spec = spec_file(tmp_path, 'name = "nul"\ncommand = ["python3", "-c", "pass"]\nlauncher = "none"\n'
                               '[env]\nTOKEN = { value = "ab\\u0000cd", secret = true }\n')
    one_error_line(run_cli("submit", str(spec)), f"{spec}: env.TOKEN.value: a NUL byte")
    spec.write_text('name = "nul"\ncommand = ["python3", "-c", "pass\\u0000"]\nlauncher = "none"\n')
    one_error_line(run_cli("submit", str(spec)), f"{spec}: command: a NUL byte")
    if isolated_ledger.exists():
        with Ledger(isolated_ledger) as ledger:
            assert Table(ledger, "jobs").rows() == []


def test_a_nul_byte_in_a_sweeps_job_path_is_one_line(tmp_path, isolated_ledger):
    spec = spec_file(tmp_path, 'name = "s"\nmetric = "loss"\ndirection = "minimize"\nmethod = "grid"\njob = "job\\u0000.toml"\n'
                               '[search]\nx = { type = "choice", values = [1] }\n', "sweep.toml")
    one_error_line(run_cli("sweep", "start", str(spec)), f"{spec}: job: a NUL byte")


def test_a_huge_account_name_is_refused_with_the_value_shortened(tmp_path, isolated_ledger):
    spec = spec_file(tmp_path, 'name = "long"\ncommand = ["true"]\nlauncher = "none"\n'
                               f'[resources]\naccount = "{"a" * 10000}"\n')
    done = run_cli("submit", "--dry-run", str(spec))
    one_error_line(done, f"{spec}: resources.account: expected a Slurm name")
    assert len(done.stderr) < 400


def test_slurms_refusal_keeps_every_error_line():
    text = ("sbatch: error: QOSMaxSubmitJobPerUserLimit\n"
            "sbatch: error: Batch job submission failed: Job violates accounting/QOS policy\n")
    assert complaint(text) == ("sbatch: error: QOSMaxSubmitJobPerUserLimit; "
                               "Batch job submission failed: Job violates accounting/QOS policy")
    assert complaint("scontrol: note\nsqueue: error: " + "x" * 1000).endswith("...")
    assert len(complaint("sbatch: error: " + "x" * 1000)) == 400
    assert complaint("") == "failed with no message"


# Every string a sweep spec can hold (its inline job's too), set to text a user could type: registered, or one line.

SWEEP_BASE: dict[str, Any] = {
    "name": "typed-sweep", "method": "random", "metric": "loss", "direction": "minimize", "max_trials": 2,
    "search": {"lr": {"type": "choice", "values": ["a", "b"]}, "x": {"type": "uniform", "low": 0, "high": 1}},
    "early_stopping": {"rule": "median", "metric": "loss"},
    "job": {"name": "trial", "command": ["python", "-c", "print(1)"], "launcher": "none",
            "resources": {"mem": "100M", "time": "00:02:00", "account": "teama"}, "env": {"GREETING": "hi"}},
}
SWEEP_LEAVES = string_leaves(SWEEP_BASE)


@examples(100)
@given(path=st.sampled_from(SWEEP_LEAVES), text=typed_text)
def test_any_text_in_any_string_of_a_sweep_spec_registers_or_is_refused_in_lines(tmp_path, path, text):
    here = Path(tempfile.mkdtemp(dir=tmp_path))  # a fresh ledger per example: each spec registers on its own
    spec = write_config(here, with_value(SWEEP_BASE, path, text), "json")
    ledger_path = here / "l.db"
    result = invoke("sweep", "start", "--no-tick", str(spec), "--site", "dev", env={"HPCTRAIN_LEDGER": str(ledger_path)})
    if result.exit_code != 0:
        assert_user_error(result.exit_code, result.stderr)
    assert_ledger_untouched(ledger_path)  # registering submits nothing
    if ledger_path.exists():
        with Ledger(ledger_path) as ledger:
            assert [s["state"] for s in Table(ledger, "sweeps").rows()] in ([], ["ACTIVE"])
