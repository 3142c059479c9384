"""GPU-hours, lost work and cost from attempts rows (the cluster test compares with sacct itself)."""

from datetime import datetime

import pytest

from hpctrain.jobs.accounting import GROUPS, cost_totals, settle, summary, totals, usage
from hpctrain.jobs.goodput import GPU_CAUSES
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.ledger.schema import MIGRATIONS

H = 3600.0


def test_runs_are_counted_clipped_and_their_lost_work_priced(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        jobs = Table(ledger, "jobs")
        jobs.insert({"name": "a", "site": "dev", "account": "teama", "user": "alice", "partition": "gpu"})
        jobs.insert({"name": "b", "site": "dev", "account": "teamb", "user": "bob", "partition": "debug"})
        jobs.insert({"name": "other", "site": "elsewhere", "account": "teama", "partition": "gpu"})
        rows = [  # job, attempt, gpus, start, end, elapsed, cause
            (1, 0, 4, 0, 2 * H, 2 * H, "preemption"),  # checkpointed at 1.5 h: 0.5 h x 4 GPUs lost
            (1, 1, 4, 2.1 * H, 3.1 * H, 1 * H, "completed"),
            (2, 0, 2, 0.5 * H, 1.5 * H, 1 * H, "error"),  # no checkpoint: all of it lost
            (3, 0, 8, 0, H, H, "completed"),  # another site
        ]
        for job, attempt, gpus, start, end, elapsed, cause in rows:
            ledger.attempts.record(job, -1, attempt, alloc_gpus=gpus, started_at=start, ended_at=end, elapsed_s=elapsed,
                                   cause=cause)
        ledger.checkpoints.record({"job_id": 1, "step": 10, "path": "/c/10", "state": "deleted", "created_at": 1.5 * H})
        ledger.checkpoints.record({"job_id": 1, "step": 5, "path": "/c/5", "state": "committed", "created_at": 0.5 * H})
        runs = usage(ledger, "dev", {"gpu": 2.0, "debug": 1.0}, now=10 * H)
        clipped = usage(ledger, "dev", {}, since=H, now=10 * H)
    assert [(u.job_id, u.attempt, u.gpu_hours, u.lost_gpu_hours) for u in runs] == \
        [(1, 0, 8.0, 2.0), (2, 0, 2.0, 2.0), (1, 1, 4.0, 0.0)]
    by_account = {t.key: t for t in totals(runs, "account")}
    assert (by_account["teama"].gpu_hours, by_account["teama"].cost, by_account["teama"].runs) == (12.0, 24.0, 2)
    assert (by_account["teamb"].gpu_hours, by_account["teamb"].cost, len(by_account["teamb"].jobs)) == (2.0, 2.0, 1)
    # From hour 1 on: the first run counts 1 h of 2, job b half an hour; lost work only after hour 1 as well.
    assert [(u.job_id, u.gpu_hours, u.lost_gpu_hours) for u in clipped] == [(1, 4.0, 2.0), (2, 1.0, 1.0), (1, 4.0, 0.0)]


def test_a_resized_run_counts_sacct_gpu_seconds_and_its_spares_wait_apart(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert({"name": "a", "site": "dev", "account": "teama", "user": "alice",
                                      "partition": "gpu"})
        ledger.attempts.record(1, -1, 0, alloc_gpus=6, started_at=0, ended_at=H, elapsed_s=H, gpu_s=5 * H,
                               idle_gpu_s=1.5 * H, cause="completed")
        (run,) = usage(ledger, "dev", {}, now=2 * H)
    assert run.gpu_hours == 5.0 and run.causes["spare"] == 1.5
    assert sum(run.causes.values()) == 5.0 and run.causes["other"] == 3.5  # no trainer journal: the rest unexplained


def _mixed_history(ledger: Ledger, settled: bool) -> None:
    """Two accounts' jobs: job 1 (teama) preempted once, then measured by its trainer; job 2 (teamb) failed; job 3
    (teama) still running. With ``settled``, jobs 1 and 2 ended a week ago and have been read for the last time."""
    ended = {"ended_at": 3.1 * H, "journal_read_at": 3.2 * H} if settled else {}
    jobs = Table(ledger, "jobs")
    jobs.insert({"name": "a", "site": "dev", "account": "teama", "user": "alice", "partition": "gpu", **ended})
    jobs.insert({"name": "b", "site": "dev", "account": "teamb", "user": "bob", "partition": "debug", **ended})
    jobs.insert({"name": "c", "site": "dev", "account": "teama", "user": "alice", "partition": "gpu"})
    for job, attempt, gpus, start, end, cause in [(1, 0, 4, 0, 2 * H, "preemption"), (1, 1, 4, 2.1 * H, 3.1 * H, "completed"),
                                                 (2, 0, 2, 0.5 * H, 1.5 * H, "error"), (3, 0, 8, 2.5 * H, None, None)]:
        ledger.attempts.record(job, -1, attempt, alloc_gpus=gpus, started_at=start, ended_at=end,
                               elapsed_s=None if end is None else end - start, cause=cause)
    ledger.checkpoints.record({"job_id": 1, "step": 10, "path": "/c/10", "state": "committed", "created_at": 1.5 * H})
    Table(ledger, "segments").insert({"job_id": 1, "attempt": 1, "main_at": 2.1 * H, "loaded_at": 2.2 * H,
                                      "resumed_from": 10, "steps": 90, "step_seconds": 0.7 * H, "last_step": 100,
                                      "last_step_at": 3.0 * H})


def _figures(runs: list) -> list[tuple]:
    return [(u.job_id, u.attempt, u.measured, u.queue_s) + tuple(round(x, 9) for x in (
        u.gpu_hours, u.lost_gpu_hours, u.cost, *(u.causes[c] for c in GPU_CAUSES))) for u in runs]


def test_settled_runs_are_kept_once_and_count_as_when_measured(tmp_path):
    prices, now = {"gpu": 2.0, "debug": 1.0}, 8 * 86400.0
    with Ledger(tmp_path / "live.db") as live, Ledger(tmp_path / "kept.db") as kept:
        _mixed_history(live, settled=False)
        _mixed_history(kept, settled=True)
        for since in (None, H, 2.5 * H):
            assert _figures(usage(kept, "dev", prices, since, now)) == _figures(usage(live, "dev", prices, since, now))
        assert settle(kept, "dev", now) == 0  # kept by the first call, once
        assert kept.db.execute("SELECT job_id, attempt, measured FROM run_usage ORDER BY 1, 2").fetchall() == \
            [(1, 0, 0), (1, 1, 1), (2, 0, 0)]
        assert [u.job_id for u in usage(kept, "dev", prices, now=now, account="teamb")] == [2]
        assert [u.attempt for u in usage(kept, "dev", prices, now=now, job_id=1)] == [0, 1]
        assert live.db.execute("SELECT count(*) FROM run_usage").fetchone() == (0,)  # never ended: measured each time


def test_a_job_whose_end_changes_loses_its_kept_runs(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        _mixed_history(ledger, settled=True)
        settle(ledger, "dev", 8 * 86400.0)
        ledger.jobs.set_state(1, "REQUEUED", ended_at=None)  # as supervision does when it requeues a failed job
        assert ledger.db.execute("SELECT DISTINCT job_id FROM run_usage").fetchall() == [(2,)]
        assert ledger.db.execute("SELECT job_id FROM job_usage").fetchall() == [(2,)]
        # Its runs' rates are taken back from the minutes of their starts and ends: what is left is job 2's.
        left = ledger.db.execute("SELECT sum(started_rate), sum(ended_rate), sum(ended_hours) FROM usage_minutes").fetchone()
        rate, hours = ledger.db.execute("SELECT gpu_hours / (ended_at - started_at), gpu_hours FROM run_usage").fetchone()
        assert left == pytest.approx((rate, rate, hours))
        assert ledger.jobs.get(1)["usage_settled_at"] is None and ledger.jobs.get(2)["usage_settled_at"] is not None


def test_an_account_summary_sums_what_usage_counts(tmp_path):
    prices, points = {"gpu": 2.0, "debug": 1.0}, 8
    with Ledger(tmp_path / "l.db") as ledger:
        _mixed_history(ledger, settled=True)  # jobs 1 and 2 summed by the ledger, job 3 measured live
        # Windows with whole-minute edges and with edges within a minute, one ending before a kept run's end.
        for since, account, now in ((None, None, 4 * H), (H, None, 4 * H), (H, "teama", 4 * H), (2.5 * H, "teamb", 4 * H),
                                    (2.7 * H, None, 4 * H), (H + 17, None, 3 * H + 29), (2.1 * H + 30, "teama", 3.1 * H - 5)):
            got = summary(ledger, "dev", prices, since, now, account, points)
            runs = usage(ledger, "dev", prices, since, now, account=account)
            want = totals(runs, "account")
            assert [(t.key, t.jobs, t.runs, t.queue_s) for t in got.totals] == [(t.key, t.jobs, t.runs, t.queue_s) for t in want]
            for a, b in zip(got.totals, want):
                assert (a.gpu_hours, a.lost_gpu_hours, a.cost, a.measured_gpu_hours) == \
                    pytest.approx((b.gpu_hours, b.lost_gpu_hours, b.cost, b.measured_gpu_hours))
                assert a.causes == pytest.approx(b.causes)
            assert list(got.days) == sorted({datetime.fromtimestamp(u.started_at).strftime("%Y-%m-%d")
                                             for u in runs if u.measured})
            t0 = (since or min(u.started_at for u in runs)) // 60 * 60  # sampled at whole minutes, up to now
            width = -(-(now - t0) // points // 60) * 60
            for acct, (times, hours) in got.curves.items():
                assert times == [min(t0 + k * width, now) for k in range(len(times))] and times[-1] == now
                assert len(times) <= points + 1
                assert hours == pytest.approx([_spread([u for u in runs if u.account == acct], since or 0.0, now, t)
                                               for t in times])
            assert set(got.curves) == {t.key for t in want}


def _spread(runs: list, since: float, now: float, t: float) -> float:
    """GPU-hours so far at ``t``: each run's share of the window spread evenly over its time within it."""
    total = 0.0
    for u in runs:
        a, b = max(u.started_at, since), min(u.ended_at if u.ended_at is not None else now, now)
        total += u.gpu_hours * (min(max((t - a) / (b - a), 0.0), 1.0) if b > a else float(t >= b))
    return total


def test_the_ledger_keeps_every_cause_of_goodput(tmp_path):
    """A column per cause in both tables of kept GPU-hours, once every migration has run."""
    with Ledger(tmp_path / "l.db") as ledger:
        for table in ("run_usage", "job_usage"):
            columns = {r[1] for r in ledger.db.execute(f"PRAGMA table_info({table})").fetchall()}
            assert {f"{c}_h" for c in GPU_CAUSES} <= columns, table


@pytest.mark.parametrize("by", GROUPS)
def test_cost_totals_sum_in_the_ledger_what_totals_of_usage_sum_per_run(tmp_path, by):
    """`cost` sums the settled runs per job in SQL: the same totals as every run read and summed here, over a
    window that cuts runs and holds running jobs."""
    import time

    from helpers.ledger import DAY, make_history

    now = time.time()
    make_history(tmp_path / "l.db", jobs=3000, sweeps=30, metric_rows=30_000, now=now, days=60)
    prices = {"gpu": 2.5}
    with Ledger(tmp_path / "l.db") as ledger:
        want = totals(usage(ledger, "dev", prices, since=now - 7 * DAY, now=now), by)
        got = cost_totals(ledger, "dev", prices, by, since=now - 7 * DAY, now=now)
    assert sum(t.runs for t in want) > 300 and [(t.key, t.jobs, t.runs) for t in got] == [(t.key, t.jobs, t.runs) for t in want]
    for g, w in zip(got, want, strict=True):
        assert (g.gpu_hours, g.lost_gpu_hours, g.cost, g.queue_s, g.measured_gpu_hours) == pytest.approx(
            (w.gpu_hours, w.lost_gpu_hours, w.cost, w.queue_s, w.measured_gpu_hours))
        assert g.causes == pytest.approx(w.causes)


def test_the_upgrade_to_v16_sums_the_runs_kept_before_it(tmp_path):
    """A ledger whose runs were kept before job_usage and usage_minutes existed gets both from its run_usage."""
    import sqlite3

    path = tmp_path / "l.db"
    tables = ("SELECT * FROM job_usage ORDER BY job_id", "SELECT * FROM usage_minutes ORDER BY site, minute, account")
    with Ledger(path) as ledger:
        _mixed_history(ledger, settled=True)
        settle(ledger, "dev", 8 * 86400.0)
        want = [ledger.db.execute(q).fetchall() for q in tables]
    v11_trigger = next(s for s in MIGRATIONS[10] if "TRIGGER run_usage_reopened" in s)
    conn = sqlite3.connect(path)
    conn.executescript("DROP TRIGGER usage_minutes_kept; DROP TRIGGER usage_minutes_dropped; DROP TABLE usage_minutes; "
                       f"DROP TRIGGER run_usage_reopened; {v11_trigger}; DROP TABLE job_usage; "
                       "ALTER TABLE run_usage DROP COLUMN rerun_h; ALTER TABLE run_usage DROP COLUMN interactive_h; "
                       # what the migrations after 17 made (the ids' AUTOINCREMENT stays: its step skips it then)
                       "DROP TRIGGER model_versions_once; DROP INDEX evaluations_state; "
                       "ALTER TABLE evaluations DROP COLUMN submission_key; DROP TRIGGER metrics_seq_new; "
                       "DROP TRIGGER metrics_seq_changed; DROP TRIGGER evaluations_seq_new; "
                       "DROP TRIGGER evaluations_seq_changed; DROP INDEX metrics_seq; "
                       "DROP TRIGGER attempts_new_to_decide; DROP TRIGGER attempts_undecided_to_decide; "
                       "DROP TRIGGER jobs_state_to_decide; DROP TRIGGER tasks_new_to_decide; "
                       "DROP TRIGGER tasks_state_to_decide; DROP TABLE sites_to_decide; DROP TABLE ledger_info; "
                       "DROP TRIGGER attempts_new_to_supervise; DROP TRIGGER attempts_undecided_to_supervise; "
                       "DROP TRIGGER jobs_state_to_supervise; DROP TRIGGER tasks_new_to_supervise; "
                       "DROP TRIGGER tasks_state_to_supervise; DROP TABLE sites_to_supervise; "
                       "DROP TRIGGER gpu_packed_reopened; DROP TABLE gpu_runs; DROP TABLE gpu_curves; "
                       "ALTER TABLE jobs DROP COLUMN race; "
                       "ALTER TABLE metrics DROP COLUMN seq; ALTER TABLE evaluations DROP COLUMN seq; "
                       "ALTER TABLE tracker_exports RENAME COLUMN sent_seq TO metrics_rowid; "
                       "ALTER TABLE tracker_exports ADD COLUMN evaluations_at REAL NOT NULL DEFAULT 0; "
                       "DROP INDEX jobs_eval_on_checkpoint; DROP TRIGGER metric_tails_new; "
                       "DROP TRIGGER metric_tails_changed; DROP TABLE metric_tails; DROP TABLE journal_seen; "
                       "DROP TABLE gpu_use; DROP TABLE gpu_timeline; PRAGMA user_version = 15")
    conn.close()
    with Ledger(path) as ledger:
        got = [ledger.db.execute(q).fetchall() for q in tables]
    assert len(want[0]) == 2 and len(want[1]) == 6  # two jobs; three runs, each starting and ending in a minute of its own
    assert got == [[pytest.approx(row) for row in rows] for rows in want]
