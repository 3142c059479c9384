"""Values a user could type, in real submissions on the dev cluster: each gives a job, or one line naming the file
and key, and leaves no ledger row in a non-final state (the rest: tests/unit/cli/test_typed_input.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

from helpers.bad_input import (ONE_LINER, SPEC_BASES, assert_ledger_untouched, assert_user_error, examples, invoke,
                               one_error_line, spec_file, string_leaves, typed_text, with_value, write_config)
from helpers.cli import run_cli
from helpers.cluster import slurm_shims
from helpers.paths import REPO

pytestmark = pytest.mark.slurm


def test_a_one_liner_longer_than_a_file_name_runs(dev_cluster, tmp_path, isolated_ledger):
    spec = spec_file(tmp_path, f'name = "oneliner"\ncommand = [{json.dumps(sys.executable)}, "-c", '
                               f'{json.dumps(ONE_LINER)}]\nlauncher = "none"\n'
                               '[resources]\nmem = "100M"\ntime = "00:02:00"\naccount = "teama"\n')
    done = run_cli("submit", "--wait", str(spec))
    assert done.returncode == 0 and "COMPLETED" in done.stdout.splitlines()[-1], done.stdout + done.stderr
    with Ledger(isolated_ledger) as ledger:
        (job,) = Table(ledger, "jobs").rows()
    assert json.loads(job["lineage_json"])["code"] == {"entry_point": None}


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

LEAVES = [(i, path) for i, base in enumerate(SPEC_BASES) for path in string_leaves(base)]


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
