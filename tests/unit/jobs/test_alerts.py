"""Status alerts and `hpctrain metrics` on ledger rows (the cluster tests feed real ones)."""

import json
import time

from hpctrain.config.site import Alerts
from hpctrain.jobs.alerts import job_alerts
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

from helpers.cli import run_cli
from helpers.ledger import traced

LIMITS = Alerts(stall_minutes=10, data_wait_fraction=0.3)


def add_steps(ledger, job_id, steps, start, wait_s, step_s=1.0):
    ledger.db.table("metrics").insert_all(
        {"job_id": job_id, "task_index": -1, "name": name, "step": s, "value": value, "time": start + s}
        for s in steps for name, value in (("loss", 10 / s), ("step_time_s", step_s), ("data_wait_s", wait_s)))


def test_stalled_and_data_bound_jobs_are_flagged(isolated_ledger):
    now = time.time()
    with Ledger(isolated_ledger) as ledger:
        for name in ("healthy", "stalled", "starved", "silent", "done", "requeued"):
            state = "COMPLETED" if name == "done" else "RUNNING"
            Table(ledger, "jobs").insert({"name": name, "site": "dev", "state": state})
        add_steps(ledger, 1, range(1, 30), now - 40, wait_s=0.05)
        add_steps(ledger, 2, range(1, 30), now - 3600, wait_s=0.05)
        add_steps(ledger, 3, range(1, 60), now - 70, wait_s=0.6)
        ledger.attempts.record(4, -1, 0, started_at=now - 1200)  # reports no steps (a plain command): no stall clock
        add_steps(ledger, 5, range(1, 30), now - 9000, wait_s=0.9)
        add_steps(ledger, 6, range(1, 30), now - 9000, wait_s=0.05)
        ledger.attempts.record(6, -1, 0, started_at=now - 9100)
        ledger.attempts.record(6, -1, 1, started_at=now - 1200)
        jobs = Table(ledger, "jobs").rows()
        found = job_alerts(ledger, jobs, LIMITS, now=now)
    assert set(found) == {2, 3, 6}
    assert found[2] == ["stalled: no training step for 60 min"]
    assert found[3] == ["data-bound: 60% of step time waiting for data (last 20 steps)"]
    assert found[6] == ["stalled: no training step for 20 min (none since the run started)"]


def test_metrics_command_pivots_steps(isolated_ledger):
    with Ledger(isolated_ledger) as ledger:
        Table(ledger, "jobs").insert({"name": "m", "site": "dev", "state": "COMPLETED"})
        add_steps(ledger, 1, range(1, 6), time.time(), wait_s=0.1)
    out = run_cli("metrics", "1", "--no-refresh", "--json", "--tail", "2")
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows == [{"task": -1, "step": s, "loss": 10 / s, "step_time_s": 1.0, "data_wait_s": 0.1} for s in (4, 5)]
    table = run_cli("metrics", "1", "--no-refresh", "--name", "loss").stdout
    assert "loss" in table and "data_wait_s" not in table and "metrics of job 1 (m)" in table
    assert run_cli("metrics", "7", "--no-refresh").stderr.strip() == \
        "hpctrain: error: job '7': no such ledger id (see `hpctrain status --all`)"


def test_ranks_far_slower_than_their_stages_median_are_stragglers(isolated_ledger):
    # dp2 x tp2 x pp2: stage 0 is ranks 0-1 (n1) and 4-5 (n3); stage 1 ranks 2-3 (n2) and 6-7 (n4); n3 is slow,
    # and its tensor-parallel peers wait for each other inside the forward pass.
    def ranks(compute):
        return [{"rank": r, "node": f"n{1 + r // 2}", "stage": r // 2 % 2, "compute_s": c} for r, c in enumerate(compute)]

    now = time.time()
    with Ledger(isolated_ledger) as ledger:
        Table(ledger, "jobs").insert({"name": "slow", "site": "dev", "state": "RUNNING"})
        add_steps(ledger, 1, range(1, 30), now - 40, wait_s=0.0)
        for step, compute in ((50, [0.10, 0.10, 0.20, 0.21, 0.11, 0.10, 0.22, 0.20]),  # n3 became slow later
                              (100, [0.10, 0.10, 0.20, 0.21, 0.19, 0.19, 0.22, 0.20])):
            ledger.event("ranks", "compute seconds per step", job_id=1, step=step, ranks=ranks(compute))
        found = job_alerts(ledger, Table(ledger, "jobs").rows(), LIMITS, now=now)
    assert found == {1: ["stragglers at step 100: rank 4 on n3 (1.9x its stage's median), "
                         "rank 5 on n3 (1.9x its stage's median)"]}


def test_a_save_far_slower_than_the_jobs_usual_and_work_long_at_risk_are_flagged(isolated_ledger):
    now = time.time()
    with Ledger(isolated_ledger) as ledger:
        for name in ("slowed", "steady", "at-risk", "requeued", "no-checkpoints"):
            Table(ledger, "jobs").insert({"name": name, "site": "dev", "state": "RUNNING"})

        def saves(job_id, durations, last_at):
            for k, seconds in enumerate(durations):
                ledger.checkpoints.record({"job_id": job_id, "task_index": -1, "step": 10 * (k + 1),
                                           "path": f"/ck/{job_id}/{k}", "state": "committed", "duration_s": seconds,
                                           "created_at": last_at - 60 * (len(durations) - 1 - k)})

        saves(1, [2.0, 2.1, 1.9, 2.0, 2.2, 20.0], now - 30)  # 10x its usual
        saves(2, [2.0, 2.1, 1.9, 2.0, 2.2, 9.0], now - 30)  # 4.5x: not yet
        saves(3, [2.0, 2.0], now - 3 * 3600)
        saves(4, [2.0, 2.0], now - 3 * 3600)
        ledger.attempts.record(4, -1, 1, started_at=now - 600)  # requeued since: its work at risk began then
        found = job_alerts(ledger, Table(ledger, "jobs").rows(), LIMITS, now=now)
    assert found == {1: ["slow saves: step 60's checkpoint took 20.0 s, 10x the median of the 5 before (2.0 s)"],
                     3: ["work at risk: 180 min since the newest committed checkpoint"]}


def test_the_alerts_of_a_job_read_as_much_after_a_long_history_as_after_a_short_one(isolated_ledger):
    """Issue 59: status's alerts read each running job's whole metric history (max(time), and the data wait over
    the last steps sorted out of all of them): 0.19 s for a job of 528 k points. Counted in SQLite's own steps."""
    now = time.time()
    with Ledger(isolated_ledger) as ledger:
        for name in ("short", "long"):
            Table(ledger, "jobs").insert({"name": name, "site": "dev", "state": "RUNNING"})
        add_steps(ledger, 1, range(1, 200), now - 300, wait_s=0.6)
        add_steps(ledger, 2, range(1, 20_000), now - 20_100, wait_s=0.6)
        jobs = Table(ledger, "jobs").rows()

        def cost(job) -> tuple[int, dict[int, list[str]]]:
            found: dict[int, list[str]] = {}
            _, steps = traced(ledger, lambda: found.update(job_alerts(ledger, [job], LIMITS, now=now)))
            return steps, found

        (short, short_found), (long, long_found) = cost(jobs[0]), cost(jobs[1])
    assert short_found[1] == long_found[2] == ["data-bound: 60% of step time waiting for data (last 20 steps)"]
    assert long <= 1.5 * short + 5, (short, long)


def test_the_alerts_of_many_running_jobs_take_the_statements_of_one(isolated_ledger):
    """Issue 59: six statements a running job were 0.05 CPU-s of each `status` with 1,334 of them."""
    now = time.time()
    with Ledger(isolated_ledger) as ledger:
        for k in range(40):
            Table(ledger, "jobs").insert({"name": f"j{k}", "site": "dev", "state": "RUNNING"})
            add_steps(ledger, k + 1, range(1, 30), now - 3600 * (k % 2), wait_s=0.05)
        jobs = Table(ledger, "jobs").rows()
        one, _ = traced(ledger, lambda: job_alerts(ledger, jobs[:1], LIMITS, now=now))
        found: dict[int, list[str]] = {}
        many, _ = traced(ledger, lambda: found.update(job_alerts(ledger, jobs, LIMITS, now=now)))
    assert len(many) == len(one)
    assert set(found) == set(range(2, 41, 2)) and found[2] == ["stalled: no training step for 60 min"]


def test_a_data_bound_alert_says_whether_the_nodes_cache_was_cold_and_show_gives_its_counts(isolated_ledger):
    now = time.time()
    cold = {"cache_hits": 3, "cache_misses": 12, "cache_waited": 2, "cache_corrupt": 1, "cache_source_bytes": 3.4e8,
            "cache_bytes": 4e8, "cache_fetch_wait_s": 2.5, "cache_fallbacks": 0}
    with Ledger(isolated_ledger) as ledger:
        for name in ("cold", "warm", "uncached"):
            Table(ledger, "jobs").insert({"name": name, "site": "dev", "state": "RUNNING"})
            add_steps(ledger, ledger.db.execute("SELECT max(id) FROM jobs").fetchone()[0], range(1, 30), now - 40,
                      wait_s=0.6)
        for job, counts in ((1, cold), (2, {**cold, "cache_misses": 0, "cache_source_bytes": 0})):
            ledger.metrics.record(job, -1, 29, counts, 0, now)
        found = job_alerts(ledger, Table(ledger, "jobs").rows(), LIMITS, now=now)
    waiting = "data-bound: 60% of step time waiting for data (last 20 steps)"
    assert found[1] == [waiting + "; the node's cache was cold: 12 shards fetched from the source so far"]
    assert found[2] == [waiting + "; every shard read from the node's cache"] and found[3] == [waiting]
    shown = run_cli("show", "1").stdout
    assert ("node cache (rank 0): 3 reads from the cache, 12 shards fetched from the source (340 MB), 2 fetched by "
            "another process while this one waited, 1 corrupt copies fetched again, 2.5 s waiting for fetches") in \
        " ".join(shown.split())
    assert json.loads(run_cli("show", "3", "--json").stdout)["cache"] is None
