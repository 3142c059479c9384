"""GPU-hours, lost work and cost from attempts rows (the cluster test compares with sacct itself)."""

from hpctrain.jobs.accounting import totals, usage
from hpctrain.ledger import Ledger

H = 3600.0


def test_runs_are_counted_clipped_and_their_lost_work_priced(tmp_path):
    with Ledger(tmp_path / "l.db") as ledger:
        ledger.insert("jobs", {"name": "a", "site": "dev", "account": "teama", "user": "alice", "partition": "gpu"})
        ledger.insert("jobs", {"name": "b", "site": "dev", "account": "teamb", "user": "bob", "partition": "debug"})
        ledger.insert("jobs", {"name": "other", "site": "elsewhere", "account": "teama", "partition": "gpu"})
        rows = [  # job, attempt, gpus, start, end, elapsed, cause
            (1, 0, 4, 0, 2 * H, 2 * H, "preemption"),  # checkpointed at 1.5 h: 0.5 h x 4 GPUs lost
            (1, 1, 4, 2.1 * H, 3.1 * H, 1 * H, "completed"),
            (2, 0, 2, 0.5 * H, 1.5 * H, 1 * H, "error"),  # no checkpoint: all of it lost
            (3, 0, 8, 0, H, H, "completed"),  # another site
        ]
        for job, attempt, gpus, start, end, elapsed, cause in rows:
            ledger.insert("attempts", {"job_id": job, "attempt": attempt, "alloc_gpus": gpus, "started_at": start,
                                       "ended_at": end, "elapsed_s": elapsed, "cause": cause})
        ledger.insert("checkpoints", {"job_id": 1, "step": 10, "path": "/c/10", "state": "deleted", "created_at": 1.5 * H})
        ledger.insert("checkpoints", {"job_id": 1, "step": 5, "path": "/c/5", "state": "committed", "created_at": 0.5 * H})
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
        ledger.insert("jobs", {"name": "a", "site": "dev", "account": "teama", "user": "alice", "partition": "gpu"})
        ledger.insert("attempts", {"job_id": 1, "attempt": 0, "alloc_gpus": 6, "started_at": 0, "ended_at": H,
                                   "elapsed_s": H, "gpu_s": 5 * H, "idle_gpu_s": 1.5 * H, "cause": "completed"})
        (run,) = usage(ledger, "dev", {}, now=2 * H)
    assert run.gpu_hours == 5.0 and run.causes["spare"] == 1.5
    assert sum(run.causes.values()) == 5.0 and run.causes["other"] == 3.5  # no trainer journal: the rest unexplained
