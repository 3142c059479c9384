"""Bad job specs, generated: every field of the spec with values it must refuse, keys it does not know, keys it
needs left out, several problems at once, odd files; each is one error line naming the file and the key, and
`hpctrain submit` refuses it before any Slurm command runs and before the ledger gets a row (helpers.bad_input)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.config import job, load_job_spec
from hpctrain.errors import ConfigError

from helpers.bad_input import (HUGE, SECRET_PATH_FIELDS, SPEC_BASES, assert_names_keys, assert_user_error, bad_command,
                               bad_env_name, bad_fraction, bad_job_name, bad_mem, bad_path, bad_positive, bad_setup,
                               bad_slurm_name, bad_time, below, dash, delete_path, examples, invoke, known_keys,
                               literal_other, not_bool, not_int, not_table, problem_lines, scalars, secret_path,
                               set_path, write_config)
from helpers.cli import run_cli

pytestmark = pytest.mark.timeout(180)  # a hang fails with its stack instead of holding the shared machine


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
    # a list is the node counts the job may start on (`shapes`), the first of them `nodes`: a list whose first is no
    # count of at least 1 names resources.nodes
    ("resources", "nodes"): st.one_of(
        below(1).filter(lambda v: not isinstance(v, list)),
        st.lists(st.one_of(st.integers(max_value=0), st.text(max_size=3), st.booleans()), max_size=2)),
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
