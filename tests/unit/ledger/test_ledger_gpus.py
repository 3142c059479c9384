"""A settled job's GPU use packed (issue 61: a heavy year's summaries were 8.5 GiB, its timelines 220 GiB): it
reads as before, its timeline thinned to a plot's worth and kept for a window of days, its samplers' notes gone;
a job reopened rebuilds it from its journal; a settle killed at any statement, or two at once, ends as one."""

from __future__ import annotations

import itertools
import math
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpctrain.contract import JobPaths
from hpctrain.jobs.accounting import GPU_CURVES_KEPT_S, settle
from hpctrain.jobs.reconcile import read_journals
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table

from helpers.gpus import sampled
from helpers.ledger import DAY, killed_at, ledger_in_child

POLICY = {"below_percent": 5, "after_s": 60, "alert_s": 600}
SETTLED = time.time() + 8 * DAY  # past the window in which journals are read: every ended job settles
TABLES = ("gpu_use", "gpu_timeline", "gpu_runs", "gpu_curves", "run_usage", "journal_ingested")


def ended_job(ledger: Ledger, job_dir: Path, monkeypatch) -> tuple[int, Journal]:
    """An ended job whose node samplers journaled two runs (n1 for 10 minutes, then n2 for 5) and one other record,
    all read into the ledger."""
    journal = Journal(job_dir / "journal")
    job = Table(ledger, "jobs").insert({"name": "j", "site": "dev", "state": "COMPLETED", "job_dir": str(job_dir),
                                        "ended_at": time.time()})
    sampled(journal, job, 0, 600, monkeypatch)
    sampled(journal, job, 1, 300, monkeypatch, node="n2")
    journal.write("note", job_id=job, message="not the sampler's")
    ingest_journal(ledger, journal)
    return job, journal


def gpu_use(ledger: Ledger, job: int) -> tuple:
    return (ledger.gpus.of_job(job), ledger.gpus.timeline(job), ledger.gpus.means([job]), ledger.gpus.idle_seconds([job]))


def count(ledger: Ledger, table: str) -> int:
    return ledger.db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def assert_same_use(packed: tuple, live: tuple) -> None:
    """The same GPU use, but for float32's precision and hundredths of a percent."""
    rows, timeline, means, idle = packed
    assert len(rows) == len(live[0]) and timeline == live[1] and means == pytest.approx(live[2], abs=0.01)
    assert idle == pytest.approx(live[3], rel=1e-6)
    for got, want in zip(rows, live[0], strict=True):
        assert got.keys() == want.keys()
        for column, value in want.items():
            assert got[column] == (value if value is None or isinstance(value, str) else pytest.approx(
                value, rel=1e-6, abs=0.005)), column


def test_a_settled_jobs_gpu_use_is_packed_and_reads_as_before(isolated_ledger, tmp_path, monkeypatch):
    with Ledger(isolated_ledger) as ledger:
        job, journal = ended_job(ledger, tmp_path, monkeypatch)
        live = gpu_use(ledger, job)
        assert count(ledger, "gpu_use") == 8 and live[3][job] == 3 * (600 + 300)  # GPUs 1-3 idle throughout
        notes = ledger.ingested.names(str(journal.dir.resolve()))
        assert settle(ledger, "dev", SETTLED) == 1
        assert [count(ledger, t) for t in ("gpu_use", "gpu_timeline", "gpu_runs", "gpu_curves")] == [0, 0, 2, 2]
        assert_same_use(gpu_use(ledger, job), live)
        kept = ledger.ingested.names(str(journal.dir.resolve()))
        assert len(kept) == 1 and kept < notes  # the other record's note, not the samplers'
        # Read again (nothing does: its journal is no longer read), the samplers' records change nothing and stay
        # unread; the journal is noted read through (its mtime).
        os.utime(journal.dir, (time.time() - 3600,) * 2)
        assert read_journals(ledger, [JobPaths.journal_of(str(tmp_path))]) == 0
        assert count(ledger, "gpu_use") == 0 and ledger.ingested.names(str(journal.dir.resolve())) == kept
        assert_same_use(gpu_use(ledger, job), live)
        # Reopened, its journal rebuilds its use though nothing was written to it since; it settles again once it
        # has ended.
        ledger.jobs.set_state(job, "REQUEUED", ended_at=None)
        assert count(ledger, "gpu_runs") == count(ledger, "gpu_curves") == 0
        assert read_journals(ledger, [JobPaths.journal_of(str(tmp_path))]) == len(notes) - 1
        assert gpu_use(ledger, job) == live
        ledger.jobs.set_state(job, "COMPLETED", ended_at=time.time())
        assert settle(ledger, "dev", SETTLED) == 1
        assert_same_use(gpu_use(ledger, job), live)


def test_a_long_timeline_is_thinned_and_curves_past_their_window_go(isolated_ledger):
    with Ledger(isolated_ledger) as ledger:
        long, short = (Table(ledger, "jobs").insert({"name": n, "site": "dev", "state": "COMPLETED"})
                       for n in ("long", "short"))
        key = {"task_index": -1, "attempt": 0, "step_restart": 0}
        for job, node, minutes in ((long, "n1", 300), (long, "n2", 100), (short, "n1", 50)):
            # GPU 0 at 0, 30, 60, 90, 0, ... percent, GPU 1 idle; memory rising 8 MiB a minute.
            points = [(60.0 * m, d, float(30 * (m % 4) if d == "0" else 0), float(8 * m * 2**20))
                      for m in range(minutes) for d in ("0", "1")]
            ledger.gpus.record({"job_id": job, **key}, node, "nvml", {}, POLICY, points, 60.0 * minutes, True)
        ledger.gpus.settle([long, short], 120, 0.0)
        rows = ledger.gpus.timeline(long)
        n1 = [r for r in rows if r.node == "n1"]
        assert len(n1) == 100 and len([r for r in rows if r.node == "n2"]) == 100  # n1's 300 minutes in runs of 3
        assert [r.at for r in n1[:2]] == [0.0, 180.0]
        assert n1[0].util == {"0": 30, "1": 0} and n1[1].util == {"0": 40, "1": 0}  # (0+30+60)/3, (90+0+30)/3
        assert n1[0].mem == {"0": 16, "1": 16} and n1[-1].mem["0"] == 8 * 299  # each run's peak
        assert len(ledger.gpus.timeline(short)) == 50
        ledger.gpus.settle([long, short], 120, 60.0 * 50)  # curves begun before minute 50 go, the others stay
        assert ledger.gpus.timeline(long) == ledger.gpus.timeline(short) == []


def test_a_curve_goes_once_its_window_has_passed_and_the_summaries_stay(isolated_ledger, tmp_path, monkeypatch):
    with Ledger(isolated_ledger) as ledger:
        job, _ = ended_job(ledger, tmp_path, monkeypatch)
        settle(ledger, "dev", time.time() + GPU_CURVES_KEPT_S + DAY)
        assert ledger.gpus.timeline(job) == [] and len(ledger.gpus.of_job(job)) == 8


def tables(path: Path) -> dict[str, set[tuple]]:
    with sqlite3.connect(path) as conn:
        found = {t: set(conn.execute(f"SELECT * FROM {t}")) for t in TABLES}
    conn.close()
    return {t: {tuple(round(v, 3) if isinstance(v, float) else v for v in row) for row in rows}
            for t, rows in found.items()}  # ingested_at and settled times differ by run


def settle_in_child(path: Path, before: Callable[[], None]) -> int:
    """Fork a process that settles ``path``'s jobs after calling ``before``; its pid."""
    return ledger_in_child(path, lambda ledger: settle(ledger, "dev", SETTLED), before)


def test_a_settle_killed_at_any_statement_or_two_at_once_end_as_one(tmp_path, monkeypatch):
    saved = tmp_path / "saved.db"
    with Ledger(saved) as ledger:
        ended_job(ledger, tmp_path, monkeypatch)
    work = tmp_path / "work.db"

    def restored() -> Path:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{work}{suffix}").unlink(missing_ok=True)
        work.write_bytes(saved.read_bytes())
        return work

    with Ledger(restored()) as ledger:
        settle(ledger, "dev", SETTLED)
    clean = tables(work)
    assert clean["gpu_runs"] and not clean["gpu_use"]
    for statement in itertools.count(1):
        _, status = os.waitpid(settle_in_child(restored(), killed_at(statement)), 0)
        with Ledger(work) as ledger:
            settle(ledger, "dev", SETTLED)
        assert without_times(tables(work)) == without_times(clean), f"killed at statement {statement}"
        if not os.WIFSIGNALED(status):
            assert os.WEXITSTATUS(status) == 0
            break
    assert statement > 5
    read, write = os.pipe()
    pids = [settle_in_child(restored(), lambda: os.read(read, 1)) for _ in range(2)]
    os.write(write, b"go")
    assert [os.waitpid(pid, 0)[1] for pid in pids] == [0, 0]
    assert without_times(tables(work)) == without_times(clean)


def without_times(found: dict[str, set[tuple]]) -> dict[str, set[tuple]]:
    """The rows but for the time a note was made (a rerun's), and nothing of a NaN (never equal to itself)."""
    return {t: {tuple(None if isinstance(v, float) and math.isnan(v) else v for v in (r[:3] if t == "journal_ingested"
                                                                                       else r)) for r in rows}
            for t, rows in found.items()}
