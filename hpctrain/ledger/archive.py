"""Old history out of the ledger file, kept: jobs that ended before a time, with every row of theirs, moved into an
archive ledger (same schema, readable as a ledger: `hpctrain --ledger ARCHIVE ...` style tools and SQLite alike).

A submission (the chunks of one array) and a sweep move whole or not at all: only when every job of theirs ended
before the time, and a sweep only once it is no longer active. A job that a model version names stays (with its
submission and sweep), and so does an evaluation job beside the job it evaluated. Queries never scan the history (indexes), so
archiving is about the file's size: the space freed is reused by new rows; `vacuum` gives it back to the disk.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.errors import HpctrainError

if TYPE_CHECKING:
    import sqlite3

    from hpctrain.ledger import Ledger

# Tables whose rows belong to a job (its job_id), children before the jobs they reference.
JOB_TABLES = (
    "array_tasks",
    "attempts",
    "checkpoints",
    "metric_tails",  # before its metrics: copied after them, their trigger would have made its rows
    "metrics",
    "events",
    "segments",
    "gpu_use",
    "gpu_timeline",
    "gpu_runs",
    "gpu_curves",
    "run_usage",
    "job_usage",
    "trials",
    "evaluations",
    "tracker_exports",
)

_DOOMED_SWEEPS = """
CREATE TEMP TABLE doomed_sweeps AS
SELECT s.id FROM main.sweeps s WHERE s.state != 'ACTIVE' AND NOT EXISTS (
    SELECT 1 FROM main.jobs j WHERE j.sweep_id = s.id AND (j.ended_at IS NULL OR j.ended_at >= :before))
"""
_DOOMED_JOBS = """
CREATE TEMP TABLE doomed_jobs AS
SELECT j.id, j.job_dir FROM main.jobs j
WHERE j.ended_at < :before
  AND (j.group_id IS NULL OR NOT EXISTS (
      SELECT 1 FROM main.jobs g WHERE g.group_id = j.group_id AND (g.ended_at IS NULL OR g.ended_at >= :before)))
  AND (j.sweep_id IS NULL OR j.sweep_id IN (SELECT id FROM doomed_sweeps))
"""
# Jobs that stay after all, until none is left to take out: a job a model version names (versions are never
# deleted); a job evaluated by, or evaluating, a job that stays (an evaluation row references both); the rest of
# a submission or sweep of which a job stays.
_KEPT_JOBS = """
DELETE FROM doomed_jobs WHERE id IN (SELECT job_id FROM main.model_versions)
   OR id IN (SELECT eval_job_id FROM main.evaluations WHERE job_id NOT IN (SELECT id FROM doomed_jobs))
   OR id IN (SELECT job_id FROM main.evaluations
             WHERE eval_job_id IS NOT NULL AND eval_job_id NOT IN (SELECT id FROM doomed_jobs))
   OR id IN (SELECT j.id FROM main.jobs j JOIN main.jobs k ON k.group_id = j.group_id
             WHERE k.id NOT IN (SELECT id FROM doomed_jobs))
   OR id IN (SELECT j.id FROM main.jobs j JOIN main.jobs k ON k.sweep_id = j.sweep_id
             WHERE k.id NOT IN (SELECT id FROM doomed_jobs))
"""
_KEPT_SWEEPS = """
DELETE FROM doomed_sweeps WHERE id IN (SELECT sweep_id FROM main.jobs WHERE id NOT IN (SELECT id FROM doomed_jobs))
"""


# The files SQLite keeps a database in: the database, its WAL and WAL index, its rollback journal.
SQLITE_FILES = ("", "-wal", "-shm", "-journal")
# The tables whose ids the ledger gives once (AUTOINCREMENT, schema v18): each archive raises their sequences above
# the ids it holds, which an archive made before may hold past the ledger's.
ID_TABLES = ("jobs", "attempts", "checkpoints", "events")


@dataclass
class Archived:
    jobs: int  # deleted from this ledger, once in the archive
    rows: int  # every row copied into the archive, the jobs' and sweeps' included
    target: Path


def archive(ledger: Ledger, target: Path, before: float) -> Archived:
    """Move the jobs that ended before ``before`` (and their sweeps, runs, metrics, events, checkpoints) into the
    ledger at ``target`` (made if missing). The rows are chosen and copied in one transaction, and deleted from this
    ledger in a second only where the archive holds each as it is here: a run stopped in between leaves them in
    both, and running it again ends it. Neither transaction writes both files (SQLite's WAL commits each file on
    its own)."""
    from hpctrain.ledger import Ledger

    _refuse_ledger_files(ledger.path, target)
    with Ledger(target):  # made, or brought to this hpctrain's schema
        pass
    conn = ledger.db.conn
    conn.execute("ATTACH DATABASE ? AS archive", [str(target)])
    wheres = _wheres()
    try:
        with ledger.transaction():
            _choose(conn, before)
            if differing := _differing(conn, wheres, keyed=True):
                raise HpctrainError(
                    f"{target}: holds {differing[1]} other {differing[0]} rows under the same keys: the archive of "
                    "another ledger? Nothing was moved"
                )
            _check_free_disk(ledger, target, conn.execute("SELECT count(*) FROM doomed_jobs").fetchone()[0])
            moved = sum(
                conn.execute(f"INSERT OR IGNORE INTO archive.{t} SELECT * FROM main.{t} WHERE {w}").rowcount
                for t, w in wheres.items()
            )
        with ledger.transaction():
            if differing := _differing(conn, wheres, keyed=False):
                raise HpctrainError(
                    f"{target}: {differing[1]} {differing[0]} rows to move are not in the archive as they are here "
                    "(rows of another ledger under their keys?): nothing was deleted; archive into another file"
                )
            _raise_sequences(conn)
            deleted = {
                table: conn.execute(f"DELETE FROM main.{table} WHERE {where}").rowcount
                for table, where in reversed(wheres.items())  # children before the rows they reference
            }
        ledger.analyze()  # the planner's statistics of the history that remains
    finally:
        conn.execute("DROP TABLE IF EXISTS temp.doomed_sweeps")
        conn.execute("DROP TABLE IF EXISTS temp.doomed_jobs")
        conn.execute("DETACH DATABASE archive")
    return Archived(deleted["jobs"], moved, target)


def _refuse_ledger_files(ledger: Path, target: Path) -> None:
    """HpctrainError where the archive at ``target``, or a file SQLite keeps beside it, would be one of the files
    SQLite keeps the ledger in (a hard or symbolic link to one included): the archive would be written over them.
    Compared by device and inode where both exist, by resolved path where one does not."""
    for mine in SQLITE_FILES:
        for theirs in SQLITE_FILES:
            ours, its = Path(f"{target}{mine}"), Path(f"{ledger}{theirs}")
            if _same_file(ours, its):
                raise HpctrainError(
                    f"{target}: the archive must be another file than the ledger and the files SQLite keeps it in "
                    f"({ours} would be {its})"
                )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except FileNotFoundError:
        return os.path.realpath(a) == os.path.realpath(b)


def _choose(conn: sqlite3.Connection, before: float) -> None:
    """The jobs and sweeps to move, in temp.doomed_jobs and temp.doomed_sweeps."""
    for name, sql in (("doomed_sweeps", _DOOMED_SWEEPS), ("doomed_jobs", _DOOMED_JOBS)):
        conn.execute(f"DROP TABLE IF EXISTS temp.{name}")
        conn.execute(sql, {"before": before})
    while conn.execute(_KEPT_JOBS).rowcount:
        pass
    conn.execute(_KEPT_SWEEPS)


# Columns that number rows in the order they reached their own file (metrics' and evaluations' seq, for exports):
# the archive's triggers number the copies anew.
LOCAL = frozenset({"seq"})


def _differing(conn: sqlite3.Connection, wheres: dict[str, str], keyed: bool) -> tuple[str, int] | None:
    """The first table with rows to move that the archive does not hold equal, column for column, and how many:
    of all those rows, or (``keyed``) of those whose primary key the archive holds."""
    columns: dict[str, list[tuple[str, int]]] = {}
    for table, column, pk in conn.execute(
        "SELECT t.name, c.name, c.pk FROM main.sqlite_master t JOIN pragma_table_info(t.name, 'main') c "
        "WHERE t.type = 'table' ORDER BY t.name, c.cid"
    ):
        columns.setdefault(table, []).append((column, pk))
    counts = []
    for table, where in wheres.items():
        key = " AND ".join(f"a.{c} = m.{c}" for c, pk in columns[table] if pk)
        equal = " AND ".join([key, *(f"a.{c} IS m.{c}" for c, pk in columns[table] if not pk and c not in LOCAL)])
        count = (
            f"SELECT count(*) FROM main.{table} m WHERE ({where}) "
            f"AND NOT EXISTS (SELECT 1 FROM archive.{table} a WHERE {equal})"
        )
        if keyed:
            count += f" AND EXISTS (SELECT 1 FROM archive.{table} a WHERE {key})"
        counts.append(f"SELECT '{table}', ({count})")
    found = dict(conn.execute(" UNION ALL ".join(counts)).fetchall())
    return next(((table, found[table]) for table in wheres if found[table]), None)


def _raise_sequences(conn: sqlite3.Connection) -> None:
    """The next id of each of ID_TABLES above every id the archive holds."""
    for table in ID_TABLES:
        conn.execute(
            "INSERT INTO main.sqlite_sequence (name, seq) SELECT ?, 0 "
            "WHERE NOT EXISTS (SELECT 1 FROM main.sqlite_sequence WHERE name = ?)",
            [table, table],
        )
        conn.execute(
            f"UPDATE main.sqlite_sequence SET seq = max(seq, (SELECT coalesce(max(id), 0) FROM archive.{table})) "
            "WHERE name = ?",
            [table],
        )


def _check_free_disk(ledger: Ledger, target: Path, jobs: int) -> None:
    """Refuse, before anything is copied, an archive the disks cannot hold. Moving a share of the jobs writes about
    that share of the ledger's size three times: into the archive, into the archive's WAL before it is folded in,
    and into this ledger's WAL for the deletes."""
    total = ledger.db.execute("SELECT count(*) FROM jobs").fetchone()[0]
    moved = ledger.path.stat().st_size * jobs / max(total, 1)
    dirs = {target.resolve().parent: 2 * moved, ledger.path.resolve().parent: moved}
    if len({d.stat().st_dev for d in dirs}) == 1:
        dirs = {target.resolve().parent: 3 * moved}
    for directory, need in dirs.items():
        if (free := shutil.disk_usage(directory).free) < need:
            raise HpctrainError(
                f"{directory}: archiving {jobs:,} jobs needs about {need / 2**30:.1f} GiB free there, "
                f"{free / 2**30:.1f} GiB is: nothing was moved"
            )


def _wheres() -> dict[str, str]:
    """Each table's rows to move, parents before the rows that reference them."""
    of_jobs = "job_id IN (SELECT id FROM doomed_jobs)"
    return {
        "sweeps": "id IN (SELECT id FROM doomed_sweeps)",
        "jobs": "id IN (SELECT id FROM doomed_jobs)",
        **{t: of_jobs for t in JOB_TABLES},
        "trials": f"{of_jobs} OR sweep_id IN (SELECT id FROM doomed_sweeps)",
        "journal_ingested": "journal IN (SELECT job_dir || '/journal' FROM doomed_jobs WHERE job_dir IS NOT NULL)",
        "journal_seen": "journal IN (SELECT job_dir || '/journal' FROM doomed_jobs WHERE job_dir IS NOT NULL)",
    }


def vacuum(ledger: Ledger) -> tuple[int, int]:
    """Rebuild the ledger file without its free pages (needs as much free disk as the file, and no other writer
    meanwhile); the file's size before and after, in bytes."""
    path = Path(ledger.path)
    before = path.stat().st_size
    ledger.db.conn.execute("VACUUM")
    ledger.analyze()
    return before, path.stat().st_size
