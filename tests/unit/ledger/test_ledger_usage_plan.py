"""The kept runs of one job or one sweep (what `compare`, `compare --sweep`, `report JOB` and `report SWEEP` read)
are found through an index led by the job's id: the rows read follow the job, not the history, even when the
plan is a SEARCH (a window search from the year's start reads every kept run as a scan would)."""

from __future__ import annotations

import re
import time

import pytest
from helpers.ledger import SITE, make_history, traced

from hpctrain.ledger import Ledger

YEAR = 365 * 86400.0


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    path = tmp_path_factory.mktemp("usage") / "ledger.db"
    now = time.time()
    make_history(path, jobs=2000, sweeps=20, metric_rows=0, now=now)
    with Ledger(path) as opened:
        yield opened, now


_TABLE = re.compile(r"\b(?:FROM|JOIN)\s+(\w+)(?:\s+(?:AS\s+)?(\w+))?", re.I)


def first_columns(conn, sql: str) -> dict[str, str]:
    """Per table the plan reads, the first column of the key each of its steps goes through (``SCAN``: none)."""
    aliases = {alias or table: table for table, alias in _TABLE.findall(sql)}
    index_tables = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type = 'index'"))
    firsts: dict[str, str] = {}
    for *_, line in conn.execute("EXPLAIN QUERY PLAN " + sql):
        m = re.match(r"(SCAN|SEARCH) (\w+)(?: USING (?:COVERING )?INDEX (\w+))?", line)
        if not m:
            continue
        if m[3]:
            firsts[index_tables[m[3]]] = conn.execute(f"PRAGMA index_info({m[3]})").fetchone()[2]
        else:
            firsts[aliases.get(m[2], m[2])] = "rowid" if "INTEGER PRIMARY KEY" in line else "SCAN"
    return firsts


def selects(statements: list[str]) -> list[str]:
    return [s for s in statements if s.lstrip().upper().startswith("SELECT")]


@pytest.mark.parametrize("which", ["job_id", "sweep_id"])
def test_the_runs_of_a_job_or_sweep_are_read_through_the_jobs_ids(ledger, which):
    """Kept runs (run_usage) through an index led by the job's id, the runs not kept yet (attempts) of the job by its
    id or of the sweep through its index, not those of every job not settled."""
    ledger, now = ledger
    conn = ledger.db.conn
    kept = conn.execute("SELECT count(*) FROM run_usage").fetchone()[0]
    job_id, sweep_id = conn.execute(
        "SELECT j.id, j.sweep_id FROM jobs j WHERE j.sweep_id IS NOT NULL AND j.id IN (SELECT job_id FROM run_usage)"
    ).fetchone()
    key = {"job_id": job_id, "sweep_id": sweep_id}[which]

    ran, steps = traced(ledger, lambda: ledger.usage.runs(SITE, now - YEAR, now, **{which: key}))
    runs = ledger.usage.runs(SITE, now - YEAR, now, **{which: key})
    assert runs and {r[which] for r in runs} == {key}
    [sql] = selects(ran)
    assert first_columns(conn, sql)["run_usage"] == "job_id"
    assert kept > 1000 and steps < kept  # a year's search visits every kept run, several VM steps each

    ran, _ = traced(ledger, lambda: ledger.attempts.unsettled_usage(SITE, now - YEAR, now, **{which: key}))
    [sql] = selects(ran)
    assert first_columns(conn, sql)["jobs"] == {"job_id": "rowid", "sweep_id": "sweep_id"}[which]
