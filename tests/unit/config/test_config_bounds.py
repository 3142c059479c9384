"""Values that once passed validation and then overflowed or broke further on: ledger and Slurm ids, seeds and
throttles past what SQLite, Slurm or torch hold; array parameters and hyperparameters JSON cannot hold as they
are; hang timeouts no clock can arm. Each is now one line naming the file and the key, before anything runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hpctrain.config import load_job_spec, load_site
from hpctrain.config.job import LEDGER_ID_MAX, SLURM_ID_MAX
from hpctrain.config.policies import MAX_TIMEOUT_S
from hpctrain.errors import ConfigError
from hpctrain.runtime.watchdog import Watchdog
from hpctrain.sweep.spec import load_sweep_spec

from helpers.bad_input import assert_ledger_untouched, assert_rejected, assert_user_error, invoke
from helpers.cli import run_cli
from helpers.paths import REPO

HEAD = 'name = "j"\ncommand = ["true"]\nlauncher = "none"\n'


def spec_file(tmp_path: Path, body: str, suffix: str = ".toml") -> Path:
    path = tmp_path / f"job{suffix}"
    path.write_text(body if suffix != ".toml" else HEAD + body)
    return path


def one_problem(path: Path, load=load_job_spec) -> str:
    """The one problem line of loading ``path``, without the file's name."""
    with pytest.raises(ConfigError) as err:
        load(path)
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{path}: "), line
    return line[len(f"{path}: "):]


# Integers past what SQLite, Slurm or torch hold.

@pytest.mark.parametrize("body, problem", [
    (f"[dependency]\nafter_jobs = [3, {LEDGER_ID_MAX + 1}]\n",
     f"dependency.after_jobs[1]: expected a number <= {LEDGER_ID_MAX}, got {LEDGER_ID_MAX + 1}"),
    (f'[dependency]\nafter_jobs = ["{10**30}"]\n', f"dependency.after_jobs[0]: expected an integer, got '{10**30}'"),
    (f"[dependency]\nafter = [{SLURM_ID_MAX + 1}]\n", "dependency.after[0]: expected a Slurm job id such as '1234' or "
                                                     f"'1234_5' (numbers up to {SLURM_ID_MAX}), got {SLURM_ID_MAX + 1}"),
    (f'[dependency]\nafter = ["12_{10**40}"]\n', "dependency.after[0]: expected a Slurm job id"),
    (f"seed = {2**64}\n", f"seed: expected a number < {2**32}, got {2**64}"),
    ("seed = -1\n", "seed: expected a number >= 0, got -1"),
    (f"[array]\ncount = 2\nthrottle = {10**20}\n", "array.throttle: expected a number <= 100000"),
])
def test_integers_past_what_sqlite_slurm_or_torch_hold_are_one_line(tmp_path, body, problem):
    assert one_problem(spec_file(tmp_path, body)).startswith(problem)


def test_the_largest_ids_and_seed_are_taken(tmp_path):
    spec = load_job_spec(spec_file(tmp_path, f'seed = {2**32 - 1}\n[dependency]\nafter = ["{SLURM_ID_MAX}_{SLURM_ID_MAX}"]\n'
                                             f'after_jobs = [{LEDGER_ID_MAX}, "{LEDGER_ID_MAX}"]\n'))
    assert spec.dependency.after_jobs == [LEDGER_ID_MAX, LEDGER_ID_MAX] and spec.seed == 2**32 - 1


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_ledger_id_past_sqlites_is_one_line_at_submit_and_dry_run(tmp_path, isolated_ledger, no_slurm, dry_run):
    spec = spec_file(tmp_path, f"[dependency]\nafter_jobs = [{2**63}]\n")
    env, calls = no_slurm
    done = run_cli("submit", str(spec), *(["--dry-run"] if dry_run else []), env=env)
    assert_rejected(done.returncode, done.stderr)
    assert f"{spec}: dependency.after_jobs[0]: expected a number <= {LEDGER_ID_MAX}" in done.stderr
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)


@pytest.mark.parametrize("args, flag", [
    (["metrics", "1", "--task", str(2**64)], "--task"),
    (["data", "synth", "OUT", "--seed", str(2**64)], "--seed"),
    (["sample", "SPEC", "--seed", str(2**32)], "--seed"),
])
def test_integer_flags_past_what_sqlite_or_torch_hold_are_refused(tmp_path, no_slurm, args, flag):
    spec = spec_file(tmp_path, "")
    result = invoke(*[{"OUT": str(tmp_path / "out"), "SPEC": str(spec)}.get(a, a) for a in args])
    assert_rejected(result.exit_code, result.stderr)
    assert f"Invalid value for '{flag}'" in result.stderr


def site_file(tmp_path: Path, extra: str, replace: tuple[str, str] = ("", "")) -> Path:
    path = tmp_path / "site.toml"
    path.write_text((REPO / "site_configs" / "dev.toml").read_text().replace(*replace) + extra)
    return path


@pytest.mark.parametrize("replace, problem", [
    (("signal_lead_s = 60", "signal_lead_s = 65536"), "defaults.signal_lead_s: expected a number <= 65535, got 65536"),
    (("timeout_s = 30", "timeout_s = 1e300"), f"slurm.timeout_s: expected a number <= {float(MAX_TIMEOUT_S)}, got 1e+300"),
])
def test_site_numbers_past_what_slurm_or_the_clock_takes_are_one_line(tmp_path, replace, problem):
    assert one_problem(site_file(tmp_path, "", replace), load_site) == problem


# Array parameters and hyperparameters: JSON data as it is, or refused.

JSON_RULE = "expected JSON data: text, a finite number, true or false, null, or a list or a table (text keys) of them"


@pytest.mark.parametrize("body, problem", [
    ("[array]\nparams = [{lr = 0.1}, {lr = 0.2, start = 2024-01-01}]\n",
     f"array.params[1].start: {JSON_RULE}, got datetime.date(2024, 1, 1)"),
    ("[array]\nparams = [{at = 07:32:00}]\n", f"array.params[0].at: {JSON_RULE}, got datetime.time(7, 32)"),
    ("[array.grid]\nlr = [0.1, 0.2]\nwhen = [1, 1979-05-27T07:32:00Z]\n", f"array.grid.when[1]: {JSON_RULE}, got datetime"),
    ("[array]\nparams = [{lr = nan}]\n", f"array.params[0].lr: {JSON_RULE}, got nan"),
    ("[hyperparameters]\nclip = inf\n", f"hyperparameters.clip: {JSON_RULE}, got inf"),
    ("[hyperparameters]\nschedule = {warmup = [1, 2020-01-01]}\n",
     f"hyperparameters.schedule: {JSON_RULE}; warmup[1] is not, got {{'warmup': [1, datetime.date(2020, 1, 1)]}}"),
])
def test_toml_values_json_cannot_hold_are_one_line(tmp_path, body, problem):
    assert one_problem(spec_file(tmp_path, body)).startswith(problem)


@pytest.mark.parametrize("value, problem", [
    ("!!binary aGk=", f"array.params[1].blob: {JSON_RULE}, got b'hi'"),
    ("!!set {a, b}", f"array.params[1].blob: {JSON_RULE}, got {{"),
    ("{1: one}", f"array.params[1].blob: {JSON_RULE}, got {{1: 'one'}}"),
    ("2024-01-01 10:00:00", f"array.params[1].blob: {JSON_RULE}, got datetime.datetime(2024, 1, 1, 10, 0)"),
])
def test_yaml_values_json_cannot_hold_are_one_line(tmp_path, value, problem):
    body = f"name: j\ncommand: ['true']\narray:\n  params:\n    - {{blob: 1}}\n    - {{blob: {value}}}\n"
    assert one_problem(spec_file(tmp_path, body, ".yaml")).startswith(problem)


def test_json_data_of_every_kind_is_taken(tmp_path):
    body = ("name: j\ncommand: ['true']\nhyperparameters: {a: null, b: [1, 2.5, true, 'x', {c: []}]}\n"
            "array:\n  grid: {x: [null, {y: [1, 'z']}], n: [-3, 1.0e-300]}\n")
    spec = load_job_spec(spec_file(tmp_path, body, ".yaml"))
    assert spec.hyperparameters == {"a": None, "b": [1, 2.5, True, "x", {"c": []}]} and spec.array.size == 4


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_date_parameter_is_refused_at_dry_run_and_submit_alike(tmp_path, isolated_ledger, no_slurm, dry_run):
    spec = spec_file(tmp_path, "[array]\nparams = [{day = 2024-01-01}]\n")
    env, calls = no_slurm
    done = run_cli("submit", str(spec), *(["--dry-run"] if dry_run else []), env=env)
    assert_user_error(done.returncode, done.stderr)
    assert f"{spec}: array.params[0].day: {JSON_RULE}" in done.stderr and done.stderr.count("\n") == 1
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)


def test_a_sweep_choice_json_cannot_hold_is_one_line(tmp_path):
    path = tmp_path / "sweep.toml"
    path.write_text('name = "s"\njob = "job.toml"\nmetric = "loss"\ndirection = "minimize"\nmethod = "grid"\n'
                    '[search.clip]\ntype = "choice"\nvalues = [1.0, inf]\n')
    assert one_problem(path, load_sweep_spec) == (
        "search.clip.values[1]: expected a finite number (a trial's parameters travel as JSON), got inf")


# Hang timeouts: finite, and at most MAX_TIMEOUT_S, in a job spec and in a site's [hang].

@pytest.mark.parametrize("value, problem", [
    ("inf", "expected a finite number, got inf"),
    ("nan", "expected a finite number, got nan"),
    ("1e300", f"expected a number <= {float(MAX_TIMEOUT_S)}, got 1e+300"),
])
@pytest.mark.parametrize("key", ["step_s", "startup_s"])
def test_a_hang_timeout_no_clock_can_arm_is_one_line(tmp_path, key, value, problem):
    assert one_problem(spec_file(tmp_path, f"[hang]\n{key} = {value}\n")) == f"hang.{key}: {problem}"
    assert one_problem(site_file(tmp_path, f"\n[hang]\n{key} = {value}\n"), load_site) == f"hang.{key}: {problem}"


def test_the_longest_hang_timeout_arms(tmp_path, monkeypatch):
    spec = load_job_spec(spec_file(tmp_path, f"[hang]\nstep_s = {MAX_TIMEOUT_S}\n"))
    monkeypatch.setenv("HPCTRAIN_JOB_DIR", str(tmp_path))
    watchdog = Watchdog()
    try:
        watchdog.phase("step", spec.hang.step_s)
        assert watchdog.deadline is not None and not math.isinf(watchdog.deadline)
    finally:
        watchdog.close()
