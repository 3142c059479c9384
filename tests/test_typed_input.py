"""Values a user could type that once crashed or stuck hpctrain: each now gives a job, or one line naming
the file and key with the value shortened, and leaves no ledger row in a non-final state."""

from __future__ import annotations

import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.slurm.client import complaint
from hpctrain.submit.lineage import entry_point

from conftest import REPO, run_cli
from test_bad_input import (SHELL, SPEC_BASES, assert_ledger_untouched, assert_user_error, examples, invoke,
                            slurm_shims, write_config)

ONE_LINER = "print(" + " + ".join(["'x'"] * 80) + ")"  # 400 characters: longer than a file name may be


def spec_file(tmp_path: Path, body: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


def one_error_line(done, *needles: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("hpctrain: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and all(n in done.stderr for n in needles), done.stderr


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


@pytest.mark.slurm
def test_a_one_liner_longer_than_a_file_name_runs(dev_cluster, tmp_path, isolated_ledger):
    spec = spec_file(tmp_path, f'name = "oneliner"\ncommand = [{json.dumps(sys.executable)}, "-c", '
                               f'{json.dumps(ONE_LINER)}]\nlauncher = "none"\n'
                               '[resources]\nmem = "100M"\ntime = "00:02:00"\naccount = "teama"\n')
    done = run_cli("submit", "--wait", str(spec))
    assert done.returncode == 0 and "COMPLETED" in done.stdout.splitlines()[-1], done.stdout + done.stderr
    with Ledger(isolated_ledger) as ledger:
        (job,) = Table(ledger, "jobs").rows()
    assert json.loads(job["lineage_json"])["code"] == {"entry_point": None}


@pytest.mark.slurm
def test_a_submission_this_machine_refuses_leaves_its_row_failed(dev_cluster, tmp_path, isolated_ledger):
    """The site's logs path is a file: the job's directory cannot be made. One line, and the ledger row
    recorded before it is SUBMIT_FAILED, not SUBMITTING."""
    blocker = tmp_path / "logs"
    blocker.write_text("a file where the logs directory should be")
    site = REPO / "site_configs" / "dev.toml"
    lines = [f'logs = "{blocker}"' if ln.startswith("logs = ") else ln for ln in site.read_text().splitlines()]
    site_file = spec_file(tmp_path, "\n".join(lines) + "\n", "site.toml")
    spec = spec_file(tmp_path, 'name = "nologs"\ncommand = ["true"]\nlauncher = "none"\n'
                               '[resources]\nmem = "100M"\ntime = "00:02:00"\naccount = "teama"\n')
    one_error_line(run_cli("submit", "--site", str(site_file), str(spec)), str(blocker))
    with Ledger(isolated_ledger) as ledger:
        (job,) = Table(ledger, "jobs").rows()
    assert job["state"] == "SUBMIT_FAILED" and "Error" in job["error"]


# Every string a job spec can hold, set to text a user could type.

def string_leaves(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Paths to every string in ``data`` (dict keys and list indexes)."""
    if isinstance(data, str):
        return [prefix]
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    return [p for k, v in items for p in string_leaves(v, (*prefix, k))]


def with_value(data: dict[str, Any], path: tuple, value: str) -> dict[str, Any]:
    data = copy.deepcopy(data)
    node = data
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return data


typed_text = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=12),  # NUL, CR, line and paragraph separators, non-ASCII
    st.sampled_from(SHELL),
    st.integers(256, 5000).map(lambda n: "é" * n),
)
LEAVES = [(i, path) for i, base in enumerate(SPEC_BASES) for path in string_leaves(base)]


@pytest.mark.slurm
@examples(120)
@given(leaf=st.sampled_from(LEAVES), text=typed_text)
def test_any_text_in_any_string_of_a_spec_renders_or_is_refused_in_lines(dev_cluster, tmp_path, leaf, text):
    base, path = leaf
    spec = write_config(tmp_path, with_value(SPEC_BASES[base], path, text), "json")
    env, calls = slurm_shims(tmp_path / "slurm", passthrough=("sacctmgr", "sshare", "scontrol", "sinfo"))
    result = invoke("submit", str(spec), "--site", "dev", "--dry-run", env={**env, "HPCTRAIN_LEDGER": str(tmp_path / "l.db")})
    if result.exit_code != 0:
        assert_user_error(result.exit_code, result.stderr)
    assert calls()["sbatch"] == 0
    assert_ledger_untouched(tmp_path / "l.db")


@pytest.mark.slurm
@pytest.mark.parametrize("path, text", [
    (("name",), "job\r"), (("name",), "naïve"), (("command", 2), "print('naïve\\r日本')"),
    (("env", "GREETING"), "a\u2028b\rc"), (("command", 2), "print(" + "1+" * 2500 + "1)"), (("workdir",), "/tmp/日本")])
def test_odd_text_in_a_real_submission_gives_a_job_or_one_line(dev_cluster, tmp_path, isolated_ledger, path, text):
    base = {"name": "typed", "command": [sys.executable, "-c", "print('ok')"], "launcher": "none",
            "resources": {"mem": "100M", "time": "00:02:00", "account": "teama"}, "env": {"GREETING": "hi"}}
    if path == ("workdir",):
        Path(text).mkdir(exist_ok=True)
    spec = write_config(tmp_path, with_value({**base, "workdir": "/tmp"}, path, text), "json")
    done = run_cli("submit", "--wait", str(spec))
    if done.returncode == 0:
        assert "COMPLETED" in done.stdout.splitlines()[-1], done.stdout
    else:
        assert_user_error(done.returncode, done.stderr)
    with Ledger(isolated_ledger) as ledger:
        assert {j["state"] for j in Table(ledger, "jobs").rows()} <= {"COMPLETED", "SUBMIT_FAILED"}


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
