"""`hpctrain ledger archive` killed at every statement and run again, and two archives into one file at once: each
ends as one clean run does, every row in exactly one of the ledger and the archive, as it was."""

from __future__ import annotations

import itertools
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.ledger import DAY, killed_at, ledger_in_child, make_history

from hpctrain.ledger import Ledger
from hpctrain.ledger.archive import JOB_TABLES, SQLITE_FILES, archive

TABLES = ("sweeps", "jobs", *JOB_TABLES, "journal_ingested")
Rows = dict[str, set[tuple]]
NOW = time.time()
CUTOFF = NOW - 150 * DAY


def rows(path: Path) -> Rows:
    with sqlite3.connect(path) as conn:
        found = {t: set(conn.execute(f"SELECT * FROM {t}")) for t in TABLES}
    conn.close()
    return found


def restore(saved: Path, work: Path) -> tuple[Path, Path]:
    """The ledger and archive as saved, in ``work``, without a WAL or journal of a run killed before."""
    for name in ("ledger.db", "archive.db"):
        for suffix in SQLITE_FILES:
            (work / f"{name}{suffix}").unlink(missing_ok=True)
        shutil.copy(saved / name, work / name)
    return work / "ledger.db", work / "archive.db"


def archive_in_child(path: Path, target: Path, before: Callable[[], None] = lambda: None) -> int:
    """Fork a process that archives ``path`` into ``target`` after calling ``before``; its pid."""
    return ledger_in_child(path, lambda ledger: archive(ledger, target, CUTOFF), before)


@pytest.fixture
def saved(tmp_path) -> Path:
    """A ledger of a hundred jobs and more, whose oldest an earlier archive moved into archive.db."""
    saved = tmp_path / "saved"
    saved.mkdir()
    make_history(saved / "ledger.db", jobs=150, sweeps=4, metric_rows=1000, now=NOW, days=365)
    with Ledger(saved / "ledger.db") as ledger:
        archive(ledger, saved / "archive.db", NOW - 300 * DAY)
    return saved


@pytest.fixture
def clean(saved, tmp_path) -> tuple[Rows, Rows]:
    """The ledger's and the archive's rows after one archive run to its end: every row in exactly one of them."""
    work = tmp_path / "clean"
    work.mkdir()
    path, target = restore(saved, work)
    before = rows(path), rows(target)
    with Ledger(path) as ledger:
        assert archive(ledger, target, CUTOFF).jobs > 20
    after = rows(path), rows(target)
    for table in before[0]:
        assert after[0][table] | after[1][table] == before[0][table] | before[1][table], table
        assert not after[0][table] & after[1][table], table
    return after


def test_an_archive_killed_at_any_statement_is_ended_by_the_next(saved, clean, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for statement in itertools.count(1):
        path, target = restore(saved, work)
        _, status = os.waitpid(archive_in_child(path, target, killed_at(statement)), 0)
        with Ledger(path) as ledger:
            archive(ledger, target, CUTOFF)
        assert (rows(path), rows(target)) == clean, f"killed at statement {statement}"
        if not os.WIFSIGNALED(status):
            assert os.WEXITSTATUS(status) == 0
            break
    assert statement > 60  # every statement of the archive's was a place to stop


def test_two_archives_at_once_end_as_one(saved, clean, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    path, target = restore(saved, work)
    read, write = os.pipe()
    pids = [archive_in_child(path, target, lambda: os.read(read, 1)) for _ in range(2)]
    os.write(write, b"go")  # both start together
    assert [os.waitpid(pid, 0)[1] for pid in pids] == [0, 0]
    assert (rows(path), rows(target)) == clean
