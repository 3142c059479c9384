"""Bad input against the dev cluster's partitions, with sbatch blocked all the same: good input passes a dry run
(the harness does not pass because everything fails), huge numbers are refused one line each (helpers.bad_input;
the rest of bad input needs no cluster: tests/unit/config/test_bad_spec.py, ...)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from helpers.bad_input import GOOD_SPEC, HUGE, assert_ledger_untouched, assert_user_error
from helpers.cli import run_cli
from helpers.cluster import slurm_shims

pytestmark = [pytest.mark.slurm,
              pytest.mark.timeout(180)]  # a hang fails with its stack instead of holding the shared machine


def dry_run(directory: Path, spec_text: str, *args: str) -> Any:
    """`hpctrain submit SPEC --dry-run ARGS` on the dev cluster, with sbatch blocked all the same."""
    env, calls = slurm_shims(directory / "slurm", passthrough=("sacctmgr", "sshare", "scontrol", "sinfo"))
    path = directory / "spec.toml"
    path.write_text(spec_text)
    out = run_cli("submit", str(path), "--site", "dev", "--dry-run", *args, env=env)
    assert calls()["sbatch"] == 0
    return out


def test_valid_spec_and_array_flag_pass_a_dry_run(dev_cluster, tmp_path, isolated_ledger):
    """The same harness accepts good input: these tests do not pass because everything fails."""
    out = dry_run(tmp_path, GOOD_SPEC, "--array", "3%1")
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --array=0-2%1" in out.stdout
    assert_ledger_untouched(isolated_ledger)


def test_huge_numbers_are_refused_against_the_partition(dev_cluster, tmp_path, isolated_ledger):
    huge = {key: str(HUGE) for key in ("nodes", "gpus_per_node", "cpus_per_task", "mem", "time")}
    text = 'name = "big"\ncommand = ["true"]\n[resources]\n' + "".join(f"{k} = {v}\n" for k, v in huge.items())
    out = dry_run(tmp_path, text)
    assert_user_error(out.returncode, out.stderr)
    assert sorted(re.findall(r"^hpctrain: error: .*?: resources\.(\w+): ", out.stderr, re.M)) == sorted(huge)
    assert_ledger_untouched(isolated_ledger)
