"""The ledger after a year: every query that `status`, `status --all`, `show`, `cost --since`, `report --account`
and a sweep tick run reads the history's tables through an index (EXPLAIN QUERY PLAN of the SQL they ran), so
their time follows the active jobs and the window asked for, not the history (benchmarks/ledger_scale.py times
them at 1,000,000 jobs)."""

from __future__ import annotations

import re
import time

import pytest

from hpctrain.config import load_site
from hpctrain.ledger import Ledger
from hpctrain.ledger.jobs import JOURNALS_READ_S
from hpctrain.slurm.states import TERMINAL

from helpers.ledger import commands, make_history

HISTORY = {"jobs", "attempts", "events", "metrics", "checkpoints", "array_tasks", "trials", "segments", "sweeps",
           "journal_ingested", "run_usage"}
_TABLE = re.compile(r'\b(?:FROM|JOIN)\s+"?(\w+)"?(?:\s+(?:AS\s+)?(?!WHERE|JOIN|ON|LEFT|ORDER|GROUP|LIMIT)(\w+))?', re.I)


def full_scans(conn, sql: str, partial: set[str]) -> list[str]:
    """The plan's scans of a history table that read all of it: not through a partial index, and not the rowid
    walk of an `ORDER BY <table>.id DESC LIMIT n`, which stops after n rows."""
    aliases = {alias or table: table for table, alias in _TABLE.findall(sql)}
    bounded = re.search(r"ORDER BY \w+\.id DESC\s+LIMIT", sql, re.I) is not None
    found = []
    for *_, line in conn.execute("EXPLAIN QUERY PLAN " + sql):
        m = re.match(r"SCAN (\w+)(?: USING (?:COVERING )?INDEX (\w+))?", line)
        if not m or aliases.get(m[1], m[1]) not in HISTORY or m[2] in partial:
            continue
        if bounded and m[2] is None:
            continue
        found.append(line)
    return found


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("history") / "ledger.db"
    now = time.time()
    make_history(path, jobs=20_000, sweeps=200, metric_rows=200_000, now=now)
    return path, now


@pytest.mark.parametrize("command", list(commands(load_site("dev"))))
def test_each_command_reads_the_history_through_indexes(history, command):
    path, now = history
    run = commands(load_site("dev"))[command]
    with Ledger(path) as ledger:
        conn = ledger.db.conn
        partial = {name for name, sql in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
                   if sql and " WHERE " in sql}
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        result = run(ledger, now)
        conn.set_trace_callback(None)
        reads = [s for s in dict.fromkeys(statements) if s.lstrip().upper().startswith(("SELECT", "WITH"))]
        scans = {" ".join(s.split())[:200]: found for s in reads if (found := full_scans(conn, s, partial))}
    assert reads and scans == {}
    if command == "sweep tick":
        assert result == []  # every run of the history has been decided on; no sweep is active


def test_an_ended_jobs_journal_is_read_until_a_read_comes_a_minute_after_its_end(tmp_path):
    with Ledger(tmp_path / "ledger.db") as ledger:
        now = time.time()
        ended = {"active": None, "just ended": now - 10, "ended before": now - 120, "last week": now - 8 * 86400}
        ids = {name: ledger.db.table("jobs").insert(
            {"name": name, "site": "dev", "state": "RUNNING" if end is None else "COMPLETED", "ended_at": end,
             "job_dir": f"/logs/{name}", "submitted_at": now - 9 * 86400}).last_pk for name, end in ended.items()}

        def to_read(at: float) -> dict[str, list[int]]:
            return ledger.jobs.journals_to_read("dev", TERMINAL, at - JOURNALS_READ_S)

        assert to_read(now) == {"/logs/active": [], "/logs/just ended": [ids["just ended"]],
                                "/logs/ended before": [ids["ended before"]]}
        ledger.jobs.journals_read([ids["just ended"], ids["ended before"]], now)
        assert to_read(now) == {"/logs/active": [], "/logs/just ended": [ids["just ended"]]}
        ledger.jobs.journals_read([ids["just ended"]], now + 50)
        assert to_read(now + 50) == {"/logs/active": []}
