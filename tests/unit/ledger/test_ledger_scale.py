"""The ledger after a year: every query that `status`, `status --all`, `show`, `cost --since`, `report --account`
and a sweep tick run reads the history's tables through an index (EXPLAIN QUERY PLAN of the SQL they ran), so
their time follows the active jobs and the window asked for, not the history (benchmarks/ledger_scale.py times
them at 1,000,000 jobs)."""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest
from helpers.ledger import commands, make_history

from hpctrain.config import load_site
from hpctrain.ledger import Ledger
from hpctrain.ledger.jobs import JOURNALS_READ_S
from hpctrain.slurm.states import TERMINAL

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


YEAR = {"jobs": 20_000, "sweeps": 200, "metric_rows": 200_000}
RECENT_DAYS = 40  # longer than any window the commands ask for
# One worker for the module: its year of history is made once, not on each worker.
pytestmark = pytest.mark.xdist_group("ledger-year")


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    path = tmp_path_factory.mktemp("history") / "ledger.db"
    now = time.time()
    make_history(path, **YEAR, now=now)
    return path, now


@pytest.fixture(scope="module")
def recent(tmp_path_factory, history):
    """The same user's last RECENT_DAYS days alone: as many jobs a day as the year, a ninth of its history."""
    path, now = tmp_path_factory.mktemp("recent") / "ledger.db", history[1]
    make_history(path, **{k: round(n * RECENT_DAYS / 365) for k, n in YEAR.items()}, now=now, days=RECENT_DAYS)
    return path, now


def without_statistics(ledger: Ledger) -> None:
    """The planner as on a ledger never analysed (as users' ledgers were before schema v15)."""
    ledger.db.conn.execute("DELETE FROM sqlite_stat1")
    ledger.db.conn.execute("ANALYZE sqlite_schema")  # the planner reloads the (now empty) statistics


_LITERAL = re.compile(r"'[^']*'|-?\b\d+(?:\.\d+)?(?:e[+-]?\d+)?\b", re.I)


def vm_work(path, now: float, command: str) -> Counter[str]:
    """SQLite virtual-machine steps (in tens) that ``command`` ran on the ledger at ``path``, by statement (its
    literals made ``?``, so that the same query on two ledgers is one key), planned without statistics."""
    work: Counter[str] = Counter()
    current = [""]

    def traced(sql: str) -> None:
        current[0] = re.sub(r"\?(?:\s*,\s*\?)+", "?", _LITERAL.sub("?", " ".join(sql.split())))

    def step() -> int:
        work[current[0]] += 1
        return 0

    with Ledger(path) as ledger:
        without_statistics(ledger)
        commands(load_site("dev"))[command](ledger, now)  # warm: what a first run writes (settled runs, decisions)
        conn = ledger.db.conn
        conn.set_trace_callback(traced)
        conn.set_progress_handler(step, 10)
        commands(load_site("dev"))[command](ledger, now)
        conn.set_progress_handler(None, 0)
        conn.set_trace_callback(None)
    return work


@pytest.mark.parametrize("command", list(commands(load_site("dev"))))
def test_no_statement_does_more_work_with_more_history(history, recent, command):
    """Each statement of each command, planned without statistics, does about the same work on a year as on the same
    user's last 40 days (nine times less history): no plan reads rows in proportion to the history, be it a SCAN
    or a SEARCH through an index that does not bound it."""
    year, days = vm_work(*history, command), vm_work(*recent, command)
    grown = {sql: (days[sql], n) for sql, n in year.items() if n > 1.3 * days[sql] + 200}
    assert sum(year.values()) and grown == {}


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


def test_the_metrics_tail_reads_its_steps_only(tmp_path):
    """`metrics --tail N`: the same rows as the last N steps of every row, with as much work at 100,000 steps as at
    1,000; series that report at other steps (evaluations every 50) and two tasks included."""
    work = {}
    for steps in (1_000, 100_000):
        with Ledger(tmp_path / f"{steps}.db") as ledger:
            job = ledger.jobs.record({"name": "long", "site": "dev"})
            ledger.db.conn.executemany(
                "INSERT INTO metrics (job_id, task_index, name, step, value) VALUES (?, ?, ?, ?, ?)",
                [(job, t, n, s, s / 7) for t in (0, 1) for s in range(1, steps + 1)
                 for n in ("loss", "lr", *(["eval/loss"] if s % 50 == 0 else []))])
            ledger.db.conn.commit()
            everything = ledger.metrics.of_job(job)
            last = set(sorted({(r["task_index"], r["step"]) for r in everything})[-20:])
            assert ledger.metrics.tail(job, 20) == [r for r in everything if (r["task_index"], r["step"]) in last]
            assert [(r["step"], r["name"]) for r in ledger.metrics.tail(job, 1, task_index=0, names=("eval/loss",))] \
                == [(steps, "eval/loss")]
            ticks = Counter()
            ledger.db.conn.set_progress_handler(lambda: ticks.update(["step"]) or 0, 10)
            ledger.metrics.tail(job, 20)
            ledger.db.conn.set_progress_handler(None, 0)
            work[steps] = ticks["step"]
    assert work[100_000] <= work[1_000] * 1.1
