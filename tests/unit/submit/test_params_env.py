"""An array task's parameter set reaches its programs as one environment entry, $HPCTRAIN_PARAMS (its JSON line of
params.jsonl): one longer than Linux lets an entry be (MAX_ARG_STRLEN) is refused at submit, naming the set, rather
than every program of the task failing to start with "Argument list too long"."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.contract import PARAMS_ENV
from hpctrain.errors import ConfigError
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit.submitter import MAX_ARG_STRLEN, Submitter, params_lines

from helpers.bad_input import assert_ledger_untouched, assert_user_error
from helpers.cli import run_cli

ENTRY_OVERHEAD = len(f"{PARAMS_ENV}=") + 1  # the name, '=' and the terminating NUL


def spec(array: dict[str, Any]) -> JobSpec:
    return JobSpec(name="big", command=["true"], launcher="none", array=array)


def blob_at_limit() -> str:
    """A value whose parameter set {"blob": value} makes an environment entry of exactly MAX_ARG_STRLEN bytes."""
    empty = len(json.dumps({"blob": ""}))
    return "x" * (MAX_ARG_STRLEN - ENTRY_OVERHEAD - empty)


def test_the_limit_is_the_kernels_exactly():
    at_limit = params_lines(spec({"params": [{"blob": blob_at_limit()}]}), "<test>")
    assert len(f"{PARAMS_ENV}={at_limit[0]}".encode()) + 1 == MAX_ARG_STRLEN
    with pytest.raises(ConfigError, match=r"^<test>: array\.params\[1\]: parameter set 1 is 131073 bytes"):
        params_lines(spec({"params": [{"blob": "small"}, {"blob": blob_at_limit() + "x"}]}), "<test>")
    if os.sysconf("SC_PAGESIZE") * 32 != MAX_ARG_STRLEN:
        pytest.skip("this kernel's pages are not 4 KiB: it takes longer entries")
    true = shutil.which("true")
    subprocess.run([true], env={PARAMS_ENV: at_limit[0]}, check=True)
    with pytest.raises(OSError) as err:
        subprocess.run([true], env={PARAMS_ENV: at_limit[0] + "x"})
    assert err.value.errno == errno.E2BIG


def test_the_lines_are_what_params_jsonl_holds():
    """Sorted keys, one JSON line per set: the size checked is the size exported."""
    lines = params_lines(spec({"grid": {"b": [1, 2], "a": ["x"]}}), "<test>")
    assert lines == ['{"a": "x", "b": 1}', '{"a": "x", "b": 2}']
    assert params_lines(spec({"count": 2}), "<test>") == ["{}", "{}"]
    assert params_lines(JobSpec(name="single", command=["true"]), "<test>") == []


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_set_too_long_is_refused_before_slurm_or_the_ledger(tmp_path, isolated_ledger, no_slurm, dry_run):
    """In process, as sweeps and the executor submit: the grid's offending set named by its index."""
    env, calls = no_slurm
    big = spec({"grid": {"lr": [0.1, 0.2], "note": ["short", "y" * MAX_ARG_STRLEN]}})
    site = load_site("dev")
    client = SlurmClient(site.slurm.conf, Path(env["PATH"].split(":")[0]), site.slurm.timeout_s)
    with Ledger(isolated_ledger) as ledger, pytest.raises(ConfigError) as err:
        Submitter(site, ledger, client).submit(big, "<sweep s1>", dry_run=dry_run)
    size = ENTRY_OVERHEAD + len(json.dumps({"lr": 0.1, "note": ""})) + MAX_ARG_STRLEN
    assert str(err.value) == (
        f"<sweep s1>: array.grid: parameter set 1 is {size} bytes as ${PARAMS_ENV} (its JSON, the "
        f"name and a NUL), more than the {MAX_ARG_STRLEN} one environment entry may hold (Linux's MAX_ARG_STRLEN)")
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)


def test_a_set_too_long_is_one_line_from_the_cli(tmp_path, isolated_ledger, no_slurm):
    path = tmp_path / "job.toml"
    path.write_text(f'name = "big"\ncommand = ["true"]\n[array]\nparams = [{{a = 1}}, {{a = "{"z" * MAX_ARG_STRLEN}"}}]\n')
    env, calls = no_slurm
    done = run_cli("submit", str(path), env=env)
    assert_user_error(done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and f"{path}: array.params[1]: parameter set 1 is " in done.stderr
    assert f"more than the {MAX_ARG_STRLEN} one environment entry may hold" in done.stderr
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)
