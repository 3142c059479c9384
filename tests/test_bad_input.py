"""Bad input, generated: job specs, site configs, CLI flags, corrupt ledgers, newer checkpoints.

Every invalid input gives one error line per problem naming the file and the key (the CLI: exit 2,
each line "hpctrain: error: ...", or click's usage error; never a traceback) and loses nothing: no
Slurm command runs, the ledger gets no row, and user files keep their bytes.
Most examples run in-process; a few go through `python -m hpctrain` as a user would.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import sqlite3
import tempfile
import time
import tomllib
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from hpctrain.cli import cli
from hpctrain.config import load_job_spec, load_site
from hpctrain.config import job, site
from hpctrain.errors import ConfigError, LedgerError
from hpctrain.jobs.accounting import GROUPS
from hpctrain.ledger import SCHEMA_VERSION, Ledger
from hpctrain.ledger.table import Table

from conftest import REPO, SHIMMED, run_cli

pytestmark = pytest.mark.timeout(180)  # a hang fails with its stack instead of holding the shared machine


def examples(n: int) -> settings:
    """``n`` examples, no deadline (the machine is shared), no example database left in the repo."""
    return settings(max_examples=n, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


# Writing generated data as the files a user would write.

def toml_key(key: str) -> str:
    # json.dumps escapes like a TOML basic string, except DEL, which TOML wants escaped too.
    return json.dumps(key, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return toml_key(value)
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def write_config(directory: Path, data: dict[str, Any], fmt: str) -> Path:
    """``data`` as <directory>/config.<fmt> (toml, json or yaml)."""
    if fmt == "yaml" and re.search("[\r\x85\u2028\u2029]", json.dumps(data, ensure_ascii=False)):
        reject()  # YAML reads these line breaks in plain keys as spaces: such data cannot be written
    path = directory / f"config.{fmt}"
    if fmt == "toml":
        path.write_text("".join(f"{toml_key(k)} = {toml_value(v)}\n" for k, v in data.items()), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps(data), encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def set_path(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    node = data
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def delete_path(data: dict[str, Any], path: tuple[str, ...]) -> None:
    node = data
    for part in path[:-1]:
        node = node[part]
    del node[path[-1]]


# Checking what came back.

def problem_lines(message: str, where: Path) -> list[str]:
    """The problem lines of a ConfigError, each checked to start with the file."""
    lines = message.splitlines()
    assert lines, "empty error message"
    for line in lines:
        assert line.startswith(f"{where}: "), f"does not start with the file: {line!r}"
    return [line[len(f"{where}: "):] for line in lines]


def dotted(key: tuple[str, ...]) -> str:
    """A key path as error lines write it: TOML's bare keys, others quoted (escaped where unprintable)."""
    return ".".join(k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k, ensure_ascii=not k.isprintable())
                    for k in key)


def names_key(line: str, key: tuple[str, ...]) -> bool:
    """Whether a problem line (file stripped) is about ``key`` or something inside it."""
    return re.match(re.escape(dotted(key)) + r"[:.\[]", line) is not None


def assert_names_keys(message: str, where: Path, keys: list[tuple[str, ...]]) -> None:
    """One line per problem: every line names one of ``keys``, every key is named."""
    lines = problem_lines(message, where)
    for line in lines:
        assert any(names_key(line, k) for k in keys), f"line names none of {keys}: {line!r}"
    for k in keys:
        assert any(names_key(line, k) for line in lines), f"{'.'.join(k)} not named in {lines}"


def assert_user_error(code: int, stderr: str) -> None:
    """Exit 2 and only 'hpctrain: error: ' lines (one per problem)."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert lines and all(line.startswith("hpctrain: error: ") for line in lines), stderr


def assert_rejected(code: int, stderr: str) -> None:
    """Exit 2 with exactly one error line: hpctrain's, or the 'Error:' line of click's usage message."""
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    if lines and lines[0].startswith("Usage: "):
        assert len([line for line in lines if line.startswith("Error: ")]) == 1, stderr
    else:
        assert len(lines) == 1 and lines[0].startswith("hpctrain: error: "), stderr


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    """`hpctrain ARGS` in this process (fast); an exception other than exiting is a crash."""
    result = CliRunner().invoke(cli, list(args), prog_name="hpctrain", env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"crashed: {result.exception!r}\n{result.stderr}")
    return result


SlurmLog = tuple[dict[str, str], Callable[[], Counter]]


def slurm_shims(directory: Path, passthrough: tuple[str, ...] = ()) -> SlurmLog:
    """(env, counts()): PATH stubs that log every Slurm command; those not in ``passthrough`` fail without
    running, so that input wrongly accepted can never submit a job."""
    log = directory / "calls.log"
    directory.mkdir(exist_ok=True)
    for cmd in SHIMMED:
        run = f'exec {shutil.which(cmd)} "$@"' if cmd in passthrough else f'echo "{cmd}: blocked by the test" >&2; exit 1'
        stub = directory / cmd
        stub.write_text(f'#!/bin/bash\necho {cmd} >> {log}\n{run}\n')
        stub.chmod(0o755)

    def counts() -> Counter:
        return Counter(log.read_text().split()) if log.exists() else Counter()

    return {"PATH": f"{directory}:{os.environ['PATH']}"}, counts


@pytest.fixture
def no_slurm(tmp_path: Path) -> SlurmLog:
    return slurm_shims(tmp_path / "no-slurm")


def assert_ledger_untouched(path: Path) -> None:
    """No ledger file, or one without jobs."""
    if path.exists():
        with Ledger(path) as ledger:
            assert Table(ledger, "jobs").rows() == []


# Job specs.

BASE_SPEC: dict[str, Any] = {
    "name": "gpt-tiny",
    "command": ["python", "-m", "hpctrain.train"],
    "workdir": "/tmp",
    "seed": 3,
    "launcher": "srun",
    "requeue": True,
    "resources": {"nodes": 2, "gpus_per_node": 2, "cpus_per_task": 1, "mem": "1G", "time": "00:05:00",
                  "partition": "gpu", "account": "teamb", "qos": "normal", "preemptible": False},
    "parallel": {"dp": 2, "tp": 2, "micro_batch": 2, "grad_accum": 2, "global_batch": 8, "zero_stage": 1,
                 "precision": "bf16"},
    "model": {"layers": 4, "heads": 4, "hidden": 64, "vocab": 256, "seq_len": 64},
    "data": {"index": "/tmp/index.json", "workers": 2, "shuffle_buffer": 100, "max_quarantined_fraction": 0.1},
    "checkpoint": {"dir": "/tmp/ck", "every_steps": 10, "every_minutes": 5.0, "keep_last": 2, "async": True},
    "hyperparameters": {"lr": 3e-4},
    "env": {"GREETING": "hi", "TOKEN": {"secret": True}},
    "retry": {"on_error": False, "max_stalled_attempts": 3},
    "array": {"grid": {"lr": [0.1, 0.01]}, "throttle": 2},
    "dependency": {"after": ["1234", "1234_5"], "kind": "afterok", "singleton": False},
}
SPEC_BASES = [BASE_SPEC] + [tomllib.loads(p.read_text()) for p in sorted((REPO / "tests" / "specs").glob("*.toml"))]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8))
# None is left out where a missing value is allowed; TOML has no null, YAML and JSON do.
not_int = st.one_of(st.text(max_size=8), st.floats(), st.booleans(),
                    st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
not_bool = st.one_of(st.text(max_size=5), st.integers(), st.floats(), st.lists(st.booleans(), max_size=2))
not_str = st.one_of(st.integers(), st.floats(), st.booleans(), st.lists(st.text(max_size=3), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))
not_table = st.one_of(st.integers(), st.floats(), st.booleans(), st.text(max_size=5), st.lists(st.integers(), max_size=2))


def below(limit: int) -> st.SearchStrategy[Any]:
    return st.one_of(not_int, st.integers(max_value=limit - 1))


HUGE = 10**30
SHELL = ["a b;rm -rf ~", "x\n#SBATCH --exclusive", "$(reboot)", "`id`", "a|b", "a&b", "a>b", "'quoted'", '"dq"',
         "tab\tsep", "new\nline", "trailing\n", "", " ", "-dash", ".dot", "_under", "naïve", "日本", "a/b", "a\\b",
         "a\x00b", "a\u2028b", "#SBATCH"]
bad_slurm_name = st.one_of(
    not_str,
    st.one_of(st.sampled_from(SHELL), st.text(min_size=1, max_size=10)).filter(
        lambda s: not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", s)))
bad_job_name = st.one_of(bad_slurm_name, st.integers(65, 200).map(lambda n: "a" * n))
bad_env_name = st.one_of(st.sampled_from(SHELL + ["1ABC", "A-B", "A.B", "A\n"]), st.text(min_size=1, max_size=8)).filter(
    lambda s: not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s))
bad_time = st.one_of(
    st.sampled_from(["1:99:99", "25h", "-1", "0", "00:00:00", "1-24:00:00", "00:60", "00:30:60", "1:2:3:4", "1-",
                     "-1-00", "1.5", "", "forever", "UNLIMITED", "٣٠", "１０", "1e3", "10 x", "01:00:00 x"]),
    st.builds("{}:{:02d}:{:02d}".format, st.integers(0, 99), st.integers(60, 999), st.integers(0, 59)),
    st.builds("{}:{:02d}:{:02d}".format, st.integers(0, 99), st.integers(0, 59), st.integers(60, 999)),
    st.builds("{}-{:02d}".format, st.integers(0, 9), st.integers(24, 99)),
    st.builds("{}-{:02d}:{:02d}".format, st.integers(0, 9), st.integers(0, 23), st.integers(60, 99)),
    st.integers(max_value=0), st.floats(), st.booleans(), st.lists(st.integers(), max_size=2),
)
bad_mem = st.one_of(
    st.sampled_from(["12XB", "-1", "0", "0G", "1K", "1.5G", "16 G", "G", "", "١٦G", "16GiB", "lots", "1e3", "16P"]),
    st.builds("{}{}".format, st.integers(0, 10**6), st.sampled_from(["XB", "P", "KiB", "GG", "g b", "M M", "E"])),
    st.integers(max_value=0).map(str), st.integers(max_value=0), st.floats(), st.booleans(),
)
bad_positive = st.one_of(st.floats(max_value=0), st.just(math.inf), st.just(math.nan), st.text(max_size=4), st.booleans())
bad_fraction = st.one_of(st.floats(min_value=1, exclude_min=True), st.floats(max_value=0, exclude_max=True),
                         st.just(math.nan), st.text(max_size=4), st.booleans())
bad_mode = st.one_of(not_int, st.integers(max_value=-1), st.integers(min_value=0o1000))
bad_path = st.one_of(st.just(""), st.just("a\x00b"), st.integers(), st.booleans(), st.lists(st.text(max_size=3), max_size=2))
# Read as an option by the program it is given to (srun, apptainer, cd, exec).
dash = st.text(max_size=6).map(lambda s: "-" + s)
bad_command = st.one_of(
    st.just([]), st.sampled_from([[""], [" "], ["\t", "train.py"]]), st.text(max_size=10),
    st.tuples(dash, st.lists(st.text(max_size=4), max_size=2)).map(lambda t: [t[0], *t[1]]),
    st.lists(st.one_of(st.integers(), st.floats(), st.booleans()), min_size=1, max_size=3),
    st.lists(st.text(max_size=4), min_size=1, max_size=3).flatmap(
        lambda argv: st.integers(0, len(argv)).map(lambda i: argv[:i] + [7] + argv[i:])),
)


# Shell commands that are not complete: each would swallow the batch script's lines after it.
UNBALANCED = ["echo 'a", 'echo "a', "echo $(date", "echo ${HOME", "echo `date", "if true; then", "for i in 1; do",
              "while :; do", "case x in", "{ echo a", "( cd /", "cat <<EOF", "echo a \\", "echo a &&", "echo a |",
              "f() {"]
bad_setup = st.tuples(st.lists(st.sampled_from(["module load gcc", "export A=1", "source env.sh"]), max_size=2),
                      st.sampled_from(["", "export A=1; "]), st.sampled_from(UNBALANCED), st.integers(0, 2)).map(
    lambda t: [*t[0][:t[3]], t[1] + t[2], *t[0][t[3]:]])
# Path fields expand $NAME from the submitting environment: never a secret's (BASE_SPEC's TOKEN).
SECRET_PATH_FIELDS = [("workdir",), ("data", "index"), ("checkpoint", "dir"), ("container", "workdir")]
secret_path = st.sampled_from(["$TOKEN", "${TOKEN}", "/scratch/$TOKEN/run", "${TOKEN:-/tmp}", "~/$TOKEN", "$HOME$TOKEN"])


def literal_other(*allowed: str) -> st.SearchStrategy[Any]:
    return st.one_of(not_str, st.text(max_size=8).filter(lambda s: s not in allowed))


# Every field of the job spec with values it must refuse; a key path -> a strategy.
SPEC_FIELDS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("name",): bad_job_name,
    ("command",): bad_command,
    ("workdir",): bad_path,
    ("seed",): not_int,
    ("setup",): st.one_of(bad_setup, st.just(["echo a\necho b"])),
    ("launcher",): literal_other("srun", "none"),
    ("requeue",): not_bool,
    ("hyperparameters",): not_table,
    ("resources", "nodes"): below(1),
    ("resources", "gpus_per_node"): below(0),
    ("resources", "tasks_per_node"): below(1),
    ("resources", "cpus_per_task"): below(1),
    ("resources", "mem"): bad_mem,
    ("resources", "time"): bad_time,
    ("resources", "partition"): bad_slurm_name,
    ("resources", "account"): bad_slurm_name,
    ("resources", "qos"): bad_slurm_name,
    ("resources", "preemptible"): not_bool,
    ("parallel", "dp"): below(1),
    ("parallel", "tp"): below(1),
    ("parallel", "pp"): below(1),
    ("parallel", "micro_batch"): below(1),
    ("parallel", "grad_accum"): below(1),
    ("parallel", "global_batch"): below(1),
    ("parallel", "zero_stage"): st.one_of(not_int, st.integers(max_value=-1), st.integers(min_value=4)),
    ("parallel", "precision"): literal_other("fp32", "bf16"),
    ("model", "layers"): below(1),
    ("model", "heads"): below(1),
    ("model", "hidden"): below(1),
    ("model", "vocab"): below(2),
    ("model", "seq_len"): below(2),
    ("data", "index"): bad_path,
    ("data", "workers"): below(0),
    ("data", "shuffle_buffer"): below(0),
    ("data", "max_quarantined_fraction"): bad_fraction,
    ("checkpoint", "dir"): bad_path,
    ("checkpoint", "every_steps"): below(1),
    ("checkpoint", "every_minutes"): bad_positive,
    ("checkpoint", "keep_last"): below(1),
    ("checkpoint", "async"): not_bool,
    ("env", "GREETING"): st.one_of(st.integers(), st.floats(), st.booleans(), st.lists(st.text(max_size=2), max_size=2),
                                   st.just({"secret": False}), st.just({}), st.just({"value": 5})),
    ("retry", "on_error"): not_bool,
    ("retry", "max_stalled_attempts"): below(1),
    ("array", "grid"): st.one_of(not_table, st.just({"lr": []}), st.just({"lr": 0.1}),
                                 st.just({k: list(range(10)) for k in "abcdef"})),  # 10**6 tasks
    ("array", "throttle"): below(1),
    ("array", "params"): st.one_of(st.integers(), st.lists(st.one_of(st.integers(), st.text(max_size=3)), min_size=1,
                                                          max_size=2)),
    ("dependency", "after"): st.one_of(st.text(max_size=5),
                                       st.lists(st.sampled_from(["12a", "", "-1", "1_", "_1", "1 2", "١٢", "1\n2",
                                                                 "afterok:1"]), min_size=1, max_size=3)),
    ("dependency", "kind"): literal_other("afterok", "afterany", "afternotok"),
    ("dependency", "singleton"): not_bool,
    ("container", "image"): st.one_of(dash, st.just(""), st.just("a b")),
    # Whole sections that are not tables.
    **{(section,): not_table for section in ("resources", "parallel", "model", "data", "checkpoint", "env", "retry",
                                              "array", "dependency")},
}
# Tables of the spec and their models (for keys they do not know).
SPEC_SECTIONS: dict[tuple[str, ...], type] = {
    (): job.JobSpec, ("resources",): job.Resources, ("parallel",): job.Parallel, ("model",): job.Model,
    ("data",): job.Data, ("checkpoint",): job.CheckpointPolicy, ("retry",): job.RetryPolicy,
    ("array",): job.ArraySpec, ("dependency",): job.Dependency, ("env", "GREETING"): job.EnvVar,
}


def known_keys(model: type) -> set[str]:
    return {n for name, f in model.model_fields.items() for n in (name, f.alias) if n}


@st.composite
def spec_mutation(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, ...]]]:
    """A valid spec with one thing wrong: (spec, [the key path to be named])."""
    spec = copy.deepcopy(draw(st.sampled_from(SPEC_BASES)))
    kind = draw(st.sampled_from(["field", "field", "field", "unknown", "missing", "array_count", "env_name",
                                 "secret_path"]))
    if kind in ("field", "secret_path"):
        path = draw(st.sampled_from(sorted(SPEC_FIELDS) if kind == "field" else SECRET_PATH_FIELDS))
        if path[0] == "array":  # exactly one of params, grid, count: replace the one there
            spec["array"] = {}
        if path[0] == "container":
            spec["container"] = {"image": "/images/train.sif"}
        if kind == "secret_path":
            spec.setdefault("env", {})["TOKEN"] = {"secret": True}
        set_path(spec, path, draw(SPEC_FIELDS[path] if kind == "field" else secret_path))
        return spec, [path]
    if kind == "unknown":
        section = draw(st.sampled_from(sorted(SPEC_SECTIONS)))
        key = draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in known_keys(SPEC_SECTIONS[section])))
        if section == ("env", "GREETING"):
            spec.setdefault("env", {})["GREETING"] = {"value": "hi"}
        set_path(spec, section + (key,), draw(scalars.filter(lambda v: v is not None)))
        return spec, [section + (key,)]
    if kind == "missing":
        path = draw(st.sampled_from([("name",), ("command",)]))
        delete_path(spec, path)
        return spec, [path]
    if kind == "array_count":
        spec["array"] = {"count": draw(st.one_of(below(1), st.integers(100_001, HUGE)))}
        return spec, [("array", "count")]
    name = draw(bad_env_name)
    spec.setdefault("env", {})[name] = "value"
    return spec, [("env", name)]


@examples(400)
@given(case=spec_mutation(), fmt=st.sampled_from(["toml", "json"]))
def test_invalid_spec_names_file_and_key(tmp_path, case, fmt):
    spec, keys = case
    path = write_config(tmp_path, spec, fmt)
    with pytest.raises(ConfigError) as info:
        load_job_spec(path)
    assert_names_keys(str(info.value), path, keys)


@examples(100)
@given(base=st.sampled_from(SPEC_BASES), picks=st.data(), fmt=st.sampled_from(["toml", "json"]))
def test_several_problems_are_one_line_each(tmp_path, base, picks, fmt):
    # Leaf fields in different sections, so that no mutation hides another.
    leaves = sorted(p for p in SPEC_FIELDS if len(p) == 2 and p[0] != "array")
    paths = picks.draw(st.lists(st.sampled_from(leaves), min_size=2, max_size=4, unique_by=lambda p: p[0]))
    spec = copy.deepcopy(base)
    for p in paths:
        set_path(spec, p, picks.draw(SPEC_FIELDS[p]))
    path = write_config(tmp_path, spec, fmt)
    with pytest.raises(ConfigError) as info:
        load_job_spec(path)
    assert_names_keys(str(info.value), path, paths)


def test_every_base_spec_is_valid_as_written(tmp_path):
    for spec in SPEC_BASES:
        for fmt in ("toml", "json", "yaml"):
            assert load_job_spec(write_config(tmp_path, spec, fmt)).name == spec["name"]


@pytest.mark.parametrize("suffix, text, problem", [
    ("toml", 'name = "x"\ncommand = ["a"]\nseed = ' + "9" * 5000 + "\n", "invalid TOML: Exceeds the limit"),
    ("toml", 'name = "x"\ncommand = ["a"]\nhyperparameters = ' + "[" * 2000 + "]" * 2000 + "\n", "invalid TOML: nested too deeply"),
    ("toml", "name = 'x'\ncommand = ['a']\n[resources]\nmem = nan\n", "resources.mem: expected a memory size"),
    ("toml", "name = 'x'\ncommand = ['a']\n\"weird\\nkey\" = 1\n", '"weird\\nkey": unknown key'),
    ("yaml", "name: x\ncommand: [a]\nhyperparameters: &h {a: *h}\n", "invalid YAML: an alias refers to the node that contains it"),
    ("yaml", "name: x\ncommand: [a]\nseed: 2001-13-45\n", "invalid YAML: month must be in 1..12"),
    ("yaml", "name: x\ncommand: [a]\nworkdir: !!python/name:os.system\n", "invalid YAML (line 3, column 10): could not determine"),
    ("yaml", "name: x\ncommand: [a]\nresources: {time: 2020-01-01}\n", "resources.time: expected a Slurm time"),
])
def test_odd_spec_files(tmp_path, suffix, text, problem):
    path = tmp_path / f"spec.{suffix}"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_job_spec(path)
    (line,) = problem_lines(str(info.value), path)
    assert line.startswith(problem)


def test_spec_that_is_not_utf8(tmp_path):
    path = tmp_path / "spec.toml"
    path.write_bytes(b'name = "caf\xe9"\ncommand = ["a"]\n')
    with pytest.raises(ConfigError) as info:
        load_job_spec(path)
    assert str(info.value) == f"{path}: not UTF-8 text (undecodable byte at offset 11)"


@examples(5)
@given(case=spec_mutation())
def test_submit_refuses_an_invalid_spec_before_slurm(tmp_path, isolated_ledger, no_slurm, case):
    env, calls = no_slurm
    spec, _ = case
    path = write_config(tmp_path, spec, "toml")
    out = run_cli("submit", str(path), "--site", "dev", env=env)
    assert_user_error(out.returncode, out.stderr)
    assert all(line.startswith(f"hpctrain: error: {path}: ") for line in out.stderr.splitlines())
    assert calls() == {}
    assert not isolated_ledger.exists()


@examples(40)
@given(case=spec_mutation())
def test_submit_refuses_an_invalid_spec_in_process(tmp_path, isolated_ledger, no_slurm, case):
    env, calls = no_slurm
    path = write_config(tmp_path, case[0], "json")
    result = invoke("submit", str(path), "--site", "dev", env=env)
    assert_user_error(result.exit_code, result.stderr)
    assert calls() == {}
    assert not isolated_ledger.exists()


GOOD_SPEC = 'name = "ok"\ncommand = ["true"]\nlauncher = "none"\n[resources]\ntime = "00:01:00"\nmem = "100M"\n'


def dry_run(directory: Path, spec_text: str, *args: str) -> Any:
    """`hpctrain submit SPEC --dry-run ARGS` on the dev cluster, with sbatch blocked all the same."""
    env, calls = slurm_shims(directory / "slurm", passthrough=("sacctmgr", "sshare", "scontrol", "sinfo"))
    path = directory / "spec.toml"
    path.write_text(spec_text)
    out = run_cli("submit", str(path), "--site", "dev", "--dry-run", *args, env=env)
    assert calls()["sbatch"] == 0
    return out


@pytest.mark.slurm
def test_valid_spec_and_array_flag_pass_a_dry_run(dev_cluster, tmp_path, isolated_ledger):
    """The same harness accepts good input: these tests do not pass because everything fails."""
    out = dry_run(tmp_path, GOOD_SPEC, "--array", "3%1")
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --array=0-2%1" in out.stdout
    assert_ledger_untouched(isolated_ledger)


@pytest.mark.slurm
def test_huge_numbers_are_refused_against_the_partition(dev_cluster, tmp_path, isolated_ledger):
    huge = {key: str(HUGE) for key in ("nodes", "gpus_per_node", "cpus_per_task", "mem", "time")}
    text = 'name = "big"\ncommand = ["true"]\n[resources]\n' + "".join(f"{k} = {v}\n" for k, v in huge.items())
    out = dry_run(tmp_path, text)
    assert_user_error(out.returncode, out.stderr)
    assert sorted(re.findall(r"^hpctrain: error: .*?: resources\.(\w+): ", out.stderr, re.M)) == sorted(huge)
    assert_ledger_untouched(isolated_ledger)


# Site configs.

DEV_SITE = tomllib.loads((REPO / "site_configs" / "dev.toml").read_text())

SITE_FIELDS: dict[tuple[str, ...], st.SearchStrategy[Any]] = {
    ("name",): bad_slurm_name,
    ("description",): not_str,
    ("setup",): st.one_of(st.text(max_size=5), st.lists(st.integers(), min_size=1, max_size=2), bad_setup),
    ("containers", "apptainer"): dash,
    ("containers", "python"): dash,
    ("accounts",): st.one_of(st.just([]), not_table.filter(lambda v: not isinstance(v, list)),
                             st.lists(bad_slurm_name, min_size=1, max_size=2)),
    ("slurm", "conf"): bad_path,
    ("slurm", "timeout_s"): bad_positive,
    ("slurm", "max_array_size"): below(1),
    ("defaults", "account"): st.one_of(bad_slurm_name, st.just("teamc")),
    ("defaults", "partition"): st.one_of(bad_slurm_name, st.just("cpu")),
    ("defaults", "qos"): st.one_of(bad_slurm_name, st.just("urgent")),
    ("defaults", "preemptible_qos"): st.one_of(bad_slurm_name, st.sampled_from(["normal", "urgent"])),
    ("defaults", "time"): bad_time,
    ("defaults", "signal_lead_s"): below(10),
    ("partitions", "gpu", "gpus_per_node"): below(0),
    ("partitions", "gpu", "cpus_per_node"): below(1),
    ("partitions", "gpu", "mem_per_node"): bad_mem,
    ("partitions", "gpu", "nodes"): below(1),
    ("partitions", "gpu", "max_time"): bad_time,
    ("partitions", "gpu", "gpu_type"): bad_slurm_name,
    ("partitions", "gpu", "gpu_request"): literal_other("gpus-per-node", "gres"),
    ("qos", "low", "preemptible"): not_bool,
    ("qos", "high", "preempts"): st.one_of(st.text(max_size=3), st.lists(st.just("lowest"), min_size=1, max_size=1)),
    ("qos", "normal", "description"): not_str,
    ("paths", "data"): bad_path,
    ("paths", "logs"): bad_path,
    ("ledger", "path"): bad_path,
    ("ledger", "mode"): bad_mode,
    ("checkpoint", "mode"): bad_mode,
    ("network_env", "OMP_NUM_THREADS"): not_str,
    ("gpu_hour_price", "gpu"): st.one_of(st.text(max_size=3), st.booleans(), st.just(math.inf), st.just(math.nan)),
    ("gpu_hour_price", "cpu"): st.floats(0, 10),  # no such partition
    ("launch", "python"): st.one_of(bad_path, dash),
    ("launch", "master_port_range"): st.one_of(
        st.just([29999, 21000]), st.just([80, 90]), st.just([21000, 70000]), st.just([1, 2, 3]), st.text(max_size=3),
        st.tuples(st.integers(1024, 65535), st.integers(1024, 65535)).filter(lambda t: t[0] >= t[1]).map(list)),
    ("alerts", "stall_minutes"): bad_positive,
    ("alerts", "data_wait_fraction"): st.one_of(bad_fraction, st.just(0.0)),
    ("templates_dir",): bad_path,
    **{(section,): not_table for section in ("slurm", "defaults", "partitions", "qos", "paths", "ledger",
                                              "checkpoint", "network_env", "gpu_hour_price", "launch", "alerts")},
    ("partitions", "gpu"): not_table,
}
SITE_REQUIRED = [("name",), ("defaults",), ("partitions",), ("accounts",), ("qos",), ("paths",),
                 ("defaults", "partition"), ("partitions", "gpu", "cpus_per_node"),
                 ("partitions", "debug", "mem_per_node"), ("paths", "logs")]
SITE_SECTIONS: dict[tuple[str, ...], type] = {
    (): site.SiteConfig, ("slurm",): site.SlurmAccess, ("defaults",): site.Defaults, ("partitions", "gpu"): site.Partition,
    ("qos", "low"): site.Qos, ("paths",): site.Paths, ("ledger",): site.LedgerConfig,
    ("checkpoint",): site.CheckpointConfig, ("launch",): site.Launch, ("alerts",): site.Alerts,
}


@st.composite
def site_mutation(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, ...]]]:
    """The dev site with one thing wrong: (site, [the key path to be named])."""
    cfg = copy.deepcopy(DEV_SITE)
    kind = draw(st.sampled_from(["field", "field", "field", "unknown", "missing", "name"]))
    if kind == "field":
        path = draw(st.sampled_from(sorted(SITE_FIELDS)))
        set_path(cfg, path, draw(SITE_FIELDS[path]))
        return cfg, [path]
    if kind == "unknown":
        section = draw(st.sampled_from(sorted(SITE_SECTIONS)))
        key = draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in known_keys(SITE_SECTIONS[section])))
        set_path(cfg, section + (key,), draw(scalars.filter(lambda v: v is not None)))
        return cfg, [section + (key,)]
    if kind == "missing":
        path = draw(st.sampled_from(SITE_REQUIRED))
        delete_path(cfg, path)
        return cfg, [path]
    # A partition, QOS or network variable whose name cannot go into a script.
    section = draw(st.sampled_from(["partitions", "qos", "network_env"]))
    name = draw(bad_env_name if section == "network_env" else bad_slurm_name.filter(lambda n: isinstance(n, str)))
    cfg[section][name] = {"network_env": "x", "qos": {}}.get(section, copy.deepcopy(cfg["partitions"]["gpu"]))
    return cfg, [(section, name)]


@examples(250)
@given(case=site_mutation(), fmt=st.sampled_from(["toml", "yaml"]))
def test_invalid_site_config_names_file_and_key(tmp_path, case, fmt):
    site, keys = case
    path = write_config(tmp_path, site, fmt)
    with pytest.raises(ConfigError) as info:
        load_site(str(path))
    assert_names_keys(str(info.value), path, keys)


def test_dev_site_is_valid_as_written(tmp_path):
    for fmt in ("toml", "yaml"):
        assert load_site(str(write_config(tmp_path, DEV_SITE, fmt))).partitions["gpu"].nodes == 3


@examples(3)
@given(case=site_mutation())
def test_cli_refuses_an_invalid_site_config(tmp_path, isolated_ledger, no_slurm, case):
    env, calls = no_slurm
    path = write_config(tmp_path, case[0], "toml")
    out = run_cli("status", "--site", str(path), "--no-refresh", env=env)
    assert_user_error(out.returncode, out.stderr)
    assert all(line.startswith(f"hpctrain: error: {path}: ") for line in out.stderr.splitlines())
    assert calls() == {}
    assert not isolated_ledger.exists()


# Slurm times and memory sizes: what is refused above must not cost what Slurm accepts.

@examples(200)
@given(d=st.integers(0, 400), h=st.integers(0, 23), m=st.integers(0, 59), s=st.integers(0, 59), big=st.integers(1, 10**5))
def test_every_slurm_time_form_still_parses(d, h, m, s, big):
    from hpctrain.config.types import parse_slurm_time

    forms = {f"{big}": big * 60, f"{big}:{s:02d}": big * 60 + s, f"{big}:{m:02d}:{s:02d}": big * 3600 + m * 60 + s,
             f"{d}-{h}": d * 86400 + h * 3600, f"{d}-{h:02d}:{m:02d}": d * 86400 + h * 3600 + m * 60,
             f"{d}-{h:02d}:{m:02d}:{s:02d}": d * 86400 + h * 3600 + m * 60 + s}
    for text, seconds in forms.items():
        if seconds:
            assert parse_slurm_time(text) == seconds, text


# CLI arguments.

ARRAY_OK = re.compile(r"[0-9]+(%[0-9]*)?")
bad_array = st.one_of(
    st.sampled_from(["0", "-3", "5%x", "%", "1e3", "0%2", "x", "3%-1", "5 ", " 5", "5%%2", "2,3", "0-3", "1.5"]),
    st.text(alphabet="0123456789%-+e. x", min_size=1, max_size=6),
    st.text(min_size=1, max_size=6),
).filter(lambda a: not (ARRAY_OK.fullmatch(a) and int(a.partition("%")[0]) >= 1)
         # Other scripts' digits pass submit's isdigit() check: see test_known_cli_crashes.
         and not any(c.isdigit() and not c.isascii() for c in a))


def is_date(text: str) -> bool:
    try:
        datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return False
    return True


def converts(kind: type, text: str) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


HELP = {"-h", "--help"}
no_nul = st.text(max_size=10).filter(lambda t: "\x00" not in t and t not in HELP)
missing_job = st.one_of(no_nul.filter(lambda t: not t.isdigit()), st.integers(1, 2**63 - 1).map(str))
bad_args = st.one_of(
    bad_array.map(lambda a: ("submit", "{spec}", "--site", "dev", "--array", a)),
    no_nul.filter(lambda t: not converts(float, t)).map(lambda t: ("status", "--no-refresh", "--interval", t)),
    no_nul.filter(lambda t: not converts(float, t)).map(lambda t: ("status", "--no-refresh", "--max-interval", t)),
    no_nul.filter(lambda t: not converts(int, t)).map(lambda t: ("status", "--no-refresh", "--count", t)),
    st.one_of(no_nul, st.builds("2026-{:02d}-{:02d}".format, st.integers(0, 99), st.integers(32, 99)),
              st.builds("2026-{:02d}-01".format, st.integers(13, 99))).filter(lambda t: t and not is_date(t)).map(
        lambda t: ("cost", "--no-refresh", "--since", t)),
    no_nul.filter(lambda t: t not in GROUPS).map(lambda t: ("cost", "--no-refresh", "--by", t)),
    missing_job.map(lambda j: ("show", j)),
    missing_job.map(lambda j: ("metrics", j, "--no-refresh")),
    missing_job.map(lambda j: ("cancel", j)),
    missing_job.map(lambda j: ("rerun", j)),
    no_nul.map(lambda t: ("sweep", "status", t)),
    st.text(min_size=1, max_size=10).filter(lambda t: "\x00" not in t).map(
        lambda t: ("ckpt", "verify", "{tmp}/missing/" + t)),
)


def fill(args: tuple[str, ...], spec: Path) -> list[str]:
    """Put a valid spec file and this test's directory into generated arguments."""
    return [a.replace("{spec}", str(spec)).replace("{tmp}", str(spec.parent)) for a in args]


@examples(60)
@given(args=bad_args)
def test_bad_cli_arguments_in_process(tmp_path, isolated_ledger, no_slurm, args):
    env, calls = no_slurm
    spec = tmp_path / "ok.toml"
    spec.write_text(GOOD_SPEC)
    result = invoke(*fill(args, spec), env=env)
    assert_rejected(result.exit_code, result.stderr)
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)


@pytest.mark.parametrize("args", [
    ("submit", "{spec}", "--site", "dev", "--array", "0"),
    ("submit", "{spec}", "--site", "dev", "--array", "5%x"),
    ("status", "--no-refresh", "--interval", "abc"),
    ("cost", "--no-refresh", "--since", "2026-13-45"),
    ("show", "notanumber"),
    ("metrics", "999999", "--no-refresh"),
    ("sweep", "status", "nosuch"),
    ("ckpt", "verify", "/nonexistent"),
])
def test_bad_cli_arguments_as_a_user_runs_them(tmp_path, isolated_ledger, no_slurm, args):
    env, calls = no_slurm
    spec = tmp_path / "ok.toml"
    spec.write_text(GOOD_SPEC)
    out = run_cli(*fill(args, spec), env=env)
    assert_rejected(out.returncode, out.stderr)
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)


def test_ckpt_verify_of_a_directory_without_checkpoints(tmp_path):
    result = invoke("ckpt", "verify", str(tmp_path))
    assert_rejected(result.exit_code, result.stderr)
    assert result.stderr == f"hpctrain: error: {tmp_path}: no checkpoints (step_<N> directories) found\n"


@pytest.mark.parametrize("args", [
    ("show", "99999999999999999999"),  # past SQLite's integers
    ("metrics", "99999999999999999999", "--no-refresh"),
    ("show", "\u00b2"),  # a digit to str.isdigit, not to int()
    ("status", "--no-refresh", "--limit", "99999999999999999999"),
    ("status", "--no-refresh", "--watch", "--count", "2", "--interval", "-1"),
    ("status", "--no-refresh", "--watch", "--count", "2", "--interval", "nan"),
    ("submit", "{spec}", "--site", "dev", "--array", "5%0"),
    ("submit", "{spec}", "--site", "dev", "--array", "\u00b2"),
    ("submit", "{spec}", "--site", "dev", "--array", "100001"),
    ("submit", "{spec}", "--site", "dev", "--array", ""),
    ("cost", "--no-refresh", "--since", ""),
])
def test_edge_cli_values_are_refused(tmp_path, no_slurm, args):
    env, calls = no_slurm
    spec = tmp_path / "ok.toml"
    spec.write_text(GOOD_SPEC)
    result = invoke(*fill(args, spec), env=env)
    assert_rejected(result.exit_code, result.stderr)
    assert calls() == {}


# Corrupt ledgers: a clear line naming the file, which keeps its bytes.

def real_ledger(path: Path, jobs: int = 40) -> bytes:
    with Ledger(path) as ledger:
        for i in range(jobs):
            Table(ledger, "jobs").insert({"name": f"job{i}", "site": "dev", "state": "PENDING",
                                          "updated_at": time.time(), "spec_json": {"pad": "x" * 400}})
    return path.read_bytes()


def fresh_file(directory: Path) -> Path:
    """A new file name for each example: a connection a failed example left open must not meet the next one."""
    return Path(tempfile.mkdtemp(dir=directory)) / "ledger.db"


@examples(60)
@given(garbage=st.binary(min_size=2, max_size=8192))  # 1 byte: see test_one_byte_ledger_is_kept
def test_garbage_ledger_is_refused_and_kept(tmp_path, garbage):
    path = fresh_file(tmp_path)
    path.write_bytes(garbage)
    with pytest.raises(LedgerError) as info:
        Ledger(path)
    assert str(info.value).startswith(f"{path}: cannot open ledger: ")
    assert "\n" not in str(info.value)
    assert path.read_bytes() == garbage


def test_one_byte_ledger_is_kept(tmp_path):
    path = tmp_path / "one-byte.db"
    path.write_bytes(b"x")
    with pytest.raises(LedgerError):
        Ledger(path)
    assert path.read_bytes() == b"x"


@examples(40)
@given(cut=st.floats(0.0, 1.0))
def test_truncated_ledger_is_refused_and_kept(tmp_path, cut):
    source = tmp_path / "source.db"
    if not source.exists():
        real_ledger(source)
    data = source.read_bytes()
    page = 4096
    kept = 2 + int(cut * (len(data) - page - 3))  # 2 bytes or more (1: see above), less than all pages
    path = fresh_file(tmp_path)
    path.write_bytes(data[:kept])
    with pytest.raises(LedgerError) as info:
        Ledger(path)
    assert str(info.value).startswith(f"{path}: cannot open ledger: ")
    assert path.read_bytes() == data[:kept]


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(3000))


def _halved(path: Path) -> None:
    data = real_ledger(path, jobs=1)
    path.write_bytes(data[: len(data) // 2])


def _newer_schema(path: Path) -> None:
    real_ledger(path, jobs=1)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()


@pytest.mark.parametrize("damage, says", [
    (_garbage, "cannot open ledger: file is not a database"),
    (_halved, "cannot open ledger: database disk image is malformed"),
    (_newer_schema, f"ledger schema v{SCHEMA_VERSION + 1} is newer than this hpctrain (v{SCHEMA_VERSION}): upgrade hpctrain"),
])
def test_cli_on_a_damaged_ledger(tmp_path, damage, says):
    # Not the isolated ledger: the fixture reads that one when the test ends.
    path = tmp_path / "damaged.db"
    damage(path)
    before = path.read_bytes()
    out = run_cli("status", "--site", "dev", "--no-refresh", env={"HPCTRAIN_LEDGER": str(path)})
    assert_rejected(out.returncode, out.stderr)
    assert out.stderr == f"hpctrain: error: {path}: {says}\n"
    assert path.read_bytes() == before


def _bad_utf8_in_a_row(path: Path) -> None:
    data = real_ledger(path, jobs=3)
    assert data.count(b"job1") == 1
    path.write_bytes(data.replace(b"job1", b"jo\xff\xfe"))


def _broken_table_page(path: Path) -> None:
    real_ledger(path)
    with sqlite3.connect(path) as conn:
        (root,) = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'jobs'").fetchone()
        (page,) = conn.execute("PRAGMA page_size").fetchone()
    conn.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * page] = 0x00  # not a b-tree page type
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_bad_utf8_in_a_row, _broken_table_page])
def test_cli_on_a_ledger_damaged_inside(tmp_path, damage):
    path = tmp_path / "damaged.db"
    damage(path)
    before = path.read_bytes()
    result = invoke("status", "--site", "dev", "--no-refresh", "--all", env={"HPCTRAIN_LEDGER": str(path)})
    assert path.read_bytes() == before
    assert_rejected(result.exit_code, result.stderr)


# Checkpoints from a newer format version: refused by name, never deleted.

@pytest.fixture
def newer_checkpoint(tmp_path) -> tuple[Path, Path]:
    """(directory, its step 10) where step 5 is this format and step 10 a newer one."""
    torch = pytest.importorskip("torch")
    from hpctrain.checkpoint import Checkpointer
    from hpctrain.checkpoint.manifest import VERSION

    directory = tmp_path / "ck"
    ck = Checkpointer(directory, rank=0, world_size=1)
    ck.save(5, {"w": torch.zeros(4)})
    ck.save(10, {"w": torch.ones(4)})
    ck.close()
    manifest = directory / "step_00000010" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["version"] = VERSION + 1
    manifest.write_text(json.dumps(data))
    return directory, directory / "step_00000010"


def tree_bytes(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_ckpt_verify_names_the_newer_format(newer_checkpoint):
    from hpctrain.checkpoint.manifest import VERSION

    directory, newer = newer_checkpoint
    before = tree_bytes(directory)
    out = run_cli("ckpt", "verify", str(newer))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == (f"hpctrain: error: {newer / 'manifest.json'}: format version {VERSION + 1}, "
                                           f"this hpctrain reads {VERSION}")
    out = run_cli("ckpt", "verify", str(directory))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == f"hpctrain: error: 1 of 2 checkpoints in {directory} failed verification"
    assert f"format version {VERSION + 1}" in " ".join(out.stdout.split())
    assert tree_bytes(directory) == before


def test_ckpt_verify_says_it_once(newer_checkpoint):
    _, newer = newer_checkpoint
    out = run_cli("ckpt", "verify", str(newer))
    assert_rejected(out.returncode, out.stderr)


def test_resume_stops_at_a_newer_format(newer_checkpoint):
    from hpctrain.checkpoint import latest_valid
    from hpctrain.errors import CheckpointError

    directory, _ = newer_checkpoint
    with pytest.raises(CheckpointError, match="format version"):
        latest_valid(directory)


def test_saving_the_same_step_keeps_a_newer_format(newer_checkpoint):
    import torch

    from hpctrain.checkpoint import Checkpointer

    directory, newer = newer_checkpoint
    before = tree_bytes(newer)
    ck = Checkpointer(directory, rank=0, world_size=1)
    try:
        ck.save(10, {"w": torch.full((4,), 7.0)})
        ck.close()
    except Exception:  # refusing to save is fine; replacing it is not
        pass
    assert tree_bytes(newer) == before
