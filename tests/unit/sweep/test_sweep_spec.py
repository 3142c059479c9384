"""Sweep spec validation: good specs load with their defaults; every problem is one line naming its key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpctrain.errors import ConfigError
from hpctrain.sweep.spec import load_sweep_spec

GOOD = """\
name = "lr-sweep"
job = "jobs/train.toml"
method = "bayes"
metric = "val_loss"
direction = "minimize"
max_trials = 50
max_parallel = 4
seed = 7

[search.lr]
type = "loguniform"
low = 1e-5
high = 1e-2

[search.batch]
type = "choice"
values = [16, 32, 64]

[search.layers]
type = "int"
low = 2
high = 8
step = 2

[search.dropout]
type = "uniform"
low = 0
high = 0.5

[early_stopping]
rule = "median"
grace_steps = 100
"""

HEAD = """\
name = "s"
job = "train.toml"
metric = "loss"
direction = "minimize"
"""


def write(tmp_path: Path, text: str, name: str = "sweep.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def sweep_error(tmp_path: Path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_sweep_spec(path)
    return str(info.value).replace(str(path), "sweep.toml")


def test_good_spec_loads_with_defaults(tmp_path):
    spec = load_sweep_spec(write(tmp_path, GOOD))
    assert spec.job == "jobs/train.toml"
    assert list(spec.search) == ["lr", "batch", "layers", "dropout"]
    assert spec.search["batch"].values == [16, 32, 64]
    assert spec.search["layers"].grid_values() == range(2, 9, 2)
    assert (spec.max_trials, spec.max_parallel, spec.max_failures, spec.seed, spec.startup_trials) == (50, 4, 2, 7, 10)
    es = spec.early_stopping
    assert (es.rule, es.metric, es.grace_steps, es.min_trials) == ("median", "val_loss", 100, 3)


def test_inline_job_table_is_kept_raw(tmp_path):
    text = GOOD.replace('job = "jobs/train.toml"\n', "") + '\n[job]\nname = "t"\ncommand = ["python", "t.py"]\n'
    assert load_sweep_spec(write(tmp_path, text)).job == {"name": "t", "command": ["python", "t.py"]}


def test_grid_defaults_max_trials_to_grid_size(tmp_path):
    text = HEAD + 'method = "grid"\n[search.opt]\ntype = "choice"\nvalues = ["adam", "sgd"]\n' \
        '[search.n]\ntype = "int"\nlow = 1\nhigh = 9\nstep = 4\n'
    spec = load_sweep_spec(write(tmp_path, text))
    assert spec.grid_size() == 6 and spec.max_trials == 6


def test_halving_and_yaml(tmp_path):
    text = ("name: h\njob: t.toml\nmethod: random\nmetric: acc\ndirection: maximize\nmax_trials: 9\n"
            "search: {wd: {type: uniform, low: 0, high: 0.1}, flag: {type: choice, values: [true, false]}}\n"
            "early_stopping: {rule: halving, metric: val_acc, reduction_factor: 4, min_resource: 10}\n")
    spec = load_sweep_spec(write(tmp_path, text, "sweep.yaml"))
    es = spec.early_stopping
    assert (es.rule, es.metric, es.reduction_factor, es.min_resource) == ("halving", "val_acc", 4, 10)
    assert spec.search["flag"].values == [True, False]


@pytest.mark.parametrize(
    "method, search, expected",
    [
        ("bayes", 'type = "uniform"\nlow = 1.0\nhigh = 0.1', "search.p: low must be < high, got low = 1.0, high = 0.1"),
        ("bayes", 'type = "uniform"\nlow = 1.0', "search.p: type 'uniform' needs high"),
        ("bayes", 'type = "uniform"\nlow = "x"\nhigh = 1', "search.p.low: expected a number, got 'x'"),
        ("bayes", 'type = "uniform"\nlow = 0\nhigh = inf', "search.p.high: expected a finite number, got inf"),
        ("bayes", 'type = "uniform"\nlow = 0\nhigh = 1\nvalues = [1]',
         "search.p.values: not used by type 'uniform' (only by 'choice')"),
        ("bayes", 'type = "uniform"\nlow = 0\nhgih = 1', "search.p.hgih: unknown key"),
        ("bayes", 'type = "normal"\nlow = 0\nhigh = 1',
         "search.p.type: expected one of 'choice', 'uniform', 'loguniform' or 'int', got 'normal'"),
        ("bayes", 'type = "loguniform"\nlow = 0\nhigh = 1', "search.p.low: low must be > 0 for type 'loguniform', got 0"),
        ("bayes", 'type = "int"\nlow = 1.5\nhigh = 4', "search.p: type 'int' needs integer low and high, got low = 1.5, high = 4"),
        ("bayes", 'type = "int"\nlow = 5\nhigh = 4', "search.p: low must be <= high, got low = 5, high = 4"),
        ("bayes", 'type = "int"\nlow = 0\nhigh = 10\nstep = 3', "search.p.high: high - low = 10 must be a multiple of step = 3"),
        ("bayes", 'type = "int"\nlow = 0\nhigh = 10\nstep = 0', "search.p.step: expected a number >= 1, got 0"),
        ("bayes", 'type = "int"\nlow = 0\nhigh = 10\nlog = true', "search.p.low: low must be >= 1 with log = true, got 0"),
        ("bayes", 'type = "int"\nlow = 1\nhigh = 9\nlog = true\nstep = 2', "search.p.step: step cannot be combined with log = true"),
        ("bayes", 'type = "choice"\nvalues = []', "search.p: type 'choice' needs a non-empty list of values"),
        ("bayes", 'type = "choice"', "search.p: type 'choice' needs a non-empty list of values"),
        ("bayes", 'type = "choice"\nvalues = [1, 2, 1]', "search.p.values[2]: duplicate value 1"),
        ("bayes", 'type = "choice"\nvalues = [1, {a = 1}]',
         "search.p.values[1]: expected a string, number or boolean, got {'a': 1}"),
        ("grid", 'type = "int"\nlow = 0', "search.p: type 'int' needs high"),
        ("grid", 'type = "uniform"\nlow = 0\nhigh = 1', "search.p: method 'grid' needs type 'choice' or 'int', got 'uniform'"),
    ],
)
def test_bad_param_is_one_line_naming_it(tmp_path, method, search, expected):
    text = HEAD + f'method = "{method}"\nmax_trials = 5\n[search.p]\n{search}\n'
    assert sweep_error(tmp_path, text) == f"sweep.toml: {expected}"


@pytest.mark.parametrize(
    "old, new, expected",
    [
        ('method = "bayes"', 'method = "anneal"',
         "method: expected one of 'grid', 'random' or 'bayes', got 'anneal'"),
        ('direction = "minimize"', 'direction = "down"',
         "direction: expected one of 'minimize' or 'maximize', got 'down'"),
        ("max_trials = 50\n", "", "max_trials: missing required key for method 'bayes'"),
        ("max_trials = 50", "max_trials = 0", "max_trials: expected a number >= 1, got 0"),
        ("max_parallel = 4", "max_parallel = 0", "max_parallel: expected a number >= 1, got 0"),
        ("seed = 7", "seed = '7'", "seed: expected an integer, got '7'"),
        ('job = "jobs/train.toml"', "job = 5", "job: expected a path to a job spec file or an inline job table, got 5"),
        ('name = "lr-sweep"', 'name = "a b"', "name: expected a string matching ^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$, got 'a b'"),
        ('metric = "val_loss"\n', "", "metric: missing required key"),
        ('rule = "median"', 'rule = "hyperband"', "early_stopping.rule: expected one of 'median' or 'halving', got 'hyperband'"),
        ("grace_steps = 100", "grace_steps = 100\nreduction_factor = 2",
         "early_stopping.reduction_factor: only for rule 'halving'"),
        ('method = "bayes"', 'method = "random"\nstartup_trials = 5', "startup_trials: only for method 'bayes'"),
    ],
)
def test_bad_top_level_value_is_one_line(tmp_path, old, new, expected):
    assert old in GOOD
    assert sweep_error(tmp_path, GOOD.replace(old, new, 1)) == f"sweep.toml: {expected}"


def test_grid_max_trials_cannot_exceed_grid(tmp_path):
    text = HEAD + 'method = "grid"\nmax_trials = 4\n[search.opt]\ntype = "choice"\nvalues = ["adam", "sgd"]\n'
    assert sweep_error(tmp_path, text) == "sweep.toml: max_trials: max_trials = 4 exceeds the grid's 2 points"


def test_empty_search_is_an_error(tmp_path):
    assert sweep_error(tmp_path, HEAD + 'method = "random"\nmax_trials = 3\nsearch = {}\n') == (
        "sweep.toml: search: expected at least one parameter"
    )


def test_several_problems_give_one_line_each(tmp_path):
    text = HEAD + ('method = "random"\nmax_trials = 3\n[search.a]\ntype = "uniform"\nlow = 2\nhigh = 1\n'
                   '[search.b]\ntype = "choice"\nvalues = []\n')
    assert sweep_error(tmp_path, text).splitlines() == [
        "sweep.toml: search.a: low must be < high, got low = 2, high = 1",
        "sweep.toml: search.b: type 'choice' needs a non-empty list of values",
    ]


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_sweep_spec(tmp_path / "nope.toml")


def test_importing_sweep_stays_light():
    code = ("import sys, hpctrain.sweep, hpctrain.sweep.spec, hpctrain.sweep.methods, hpctrain.sweep.stopping; "
            "print(sorted(m for m in ('optuna', 'numpy', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
