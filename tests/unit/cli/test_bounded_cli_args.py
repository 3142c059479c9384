"""Numbers, ids and bytes at the edges (NaN, infinities, ids past SQLite's integers, arguments that are not UTF-8) and
spec files that are not regular files: each refused in one line before any work, no Slurm command run, no ledger row
(helpers.bad_input)."""

from __future__ import annotations

import os

import pytest

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

from helpers.bad_input import assert_ledger_untouched, assert_rejected, invoke

pytestmark = pytest.mark.timeout(180)  # a hang (a FIFO read) fails with its stack instead of holding the machine

PAST = str(2**63)  # one past SQLite's largest integer
TABLES = ("jobs", "evaluations", "registered_models", "model_versions", "alias_moves", "events")


@pytest.mark.parametrize("args, named", [
    (("eval", "1", "--follow", "--interval", "nan"), "--interval"),
    (("eval", "1", "--follow", "--interval", "inf"), "--interval"),
    (("eval", PAST), PAST),
    (("eval", "1", "--step", PAST), "--step"),
    (("compare", PAST), PAST),
    (("model", "register", "m", PAST), PAST),
    (("model", "register", "m", "1", "--step", PAST), "--step"),
    (("model", "promote", "m", PAST, "--alias", "prod"), PAST),
    (("export", "tensorboard", "{tmp}/tb", PAST), PAST),
    (("logs", "1", "--task", PAST), "--task"),
    (("metrics", "1", "--no-refresh", "--tail", PAST), "--tail"),
    (("metrics", "1", "--no-refresh", "--tail", "-1"), "--tail"),
    (("ledger", "archive", "--older-than", "nan"), "--older-than"),
    (("notebook", "--idle-minutes", "nan"), "--idle-minutes"),
    (("notebook", "--timeout", "inf"), "--timeout"),
    (("doctor", "--nodes", PAST), "--nodes"),
    (("launch", "--nodes", f"2,{PAST}", "--", "true"), "--nodes"),
    (("launch", "--nodes", "4,0", "--", "true"), "--nodes"),
    (("launch", "--nodes", "4,-2", "--", "true"), "--nodes"),
    (("show", "\udcff"), "not UTF-8"),
    (("sweep", "status", "a\udcffb"), "not UTF-8"),
    (("compare", "1", "--metric", "loss\udcff"), "not UTF-8"),
    (("model", "promote", "m", "1", "--alias", "prod", "--why", "\udce9t\udce9"), "not UTF-8"),
])
def test_edge_numbers_ids_and_bytes_are_refused_in_one_line(tmp_path, isolated_ledger, no_slurm, args, named):
    """Job 1 is in the ledger, running: each command would go on to work on it."""
    env, calls = no_slurm
    with Ledger(isolated_ledger) as ledger:
        Table(ledger, "jobs").insert({"name": "j", "site": "dev", "state": "RUNNING", "slurm_job_id": "41",
                                      "job_dir": str(tmp_path)})
        before = {table: Table(ledger, table).rows() for table in TABLES}
    result = invoke(*(a.replace("{tmp}", str(tmp_path)) for a in args), env=env)
    assert_rejected(result.exit_code, result.stderr)
    assert named in result.stderr, result.stderr
    assert calls() == {}
    with Ledger(isolated_ledger) as ledger:
        assert {table: Table(ledger, table).rows() for table in TABLES} == before


@pytest.mark.parametrize("args", [
    ("notebook", "--spec", "{fifo}"),
    ("submit", "{fifo}", "--dry-run"),
    ("status", "--no-refresh", "--site", "{fifo}"),
])
def test_a_spec_or_site_that_is_not_a_regular_file_is_refused(tmp_path, isolated_ledger, no_slurm, args):
    env, calls = no_slurm
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)  # read, it would wait for a writer for ever
    result = invoke(*(a.replace("{fifo}", str(fifo)) for a in args), env=env)
    assert result.exit_code == 2 and result.stderr == f"hpctrain: error: {fifo}: not a regular file\n"
    assert calls() == {}
    assert_ledger_untouched(isolated_ledger)

