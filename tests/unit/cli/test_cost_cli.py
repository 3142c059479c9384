"""`hpctrain cost --causes` in an ordinary terminal: every cause of lost GPU time named whole, at 80 columns too; its
JSON as before. `cost --by job` shows the jobs with the most GPU-hours, the rest in one line (issue 59)."""

from __future__ import annotations

import json
import time

import pytest

from hpctrain.jobs.goodput import LOST
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table

from helpers.bad_input import invoke


@pytest.fixture
def ledger_path(tmp_path):
    """Two accounts' jobs, each a run of an hour on one GPU; teamb's GPU sat idle 45 minutes of it."""
    with Ledger(tmp_path / "ledger.db") as ledger:
        for account in ("teama", "teamb"):
            job = Table(ledger, "jobs").insert({"name": "j", "site": "dev", "user": "alice", "account": account,
                                                "state": "COMPLETED"})
            ledger.attempts.record(job, -1, 1, state="COMPLETED", cause="completed", started_at=time.time() - 3600,
                                   ended_at=time.time(), alloc_gpus=1, elapsed_s=3600)
        key = {"job_id": job, "task_index": -1, "attempt": 1, "step_restart": 0}
        gpu = {"samples": 720, "seconds": 3600.0, "mean": 20.0, "idle_s": 2700.0, "idle_now_s": 0.0}
        ledger.gpus.record(key, "n1", "cpu", {"0": gpu}, {"below_percent": 5, "after_s": 60, "alert_s": 600}, [],
                           time.time(), True)
    return tmp_path / "ledger.db"


@pytest.mark.parametrize("columns", ["80", "120"])
def test_every_cause_is_named_whole_in_a_terminals_width(ledger_path, columns):
    result = invoke("cost", "--no-refresh", "--causes", env={"HPCTRAIN_LEDGER": str(ledger_path), "COLUMNS": columns})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= int(columns), result.stdout
    words = {w for line in lines for w in line.replace("│", " ").replace("┃", " ").split()}
    assert set(LOST) <= words, set(LOST) - words
    assert "queued after requeues" in result.stdout and "…" not in result.stdout
    teamb, total = [line for line in lines if "GPUs held idle" in line]  # teama's GPU was never idle: no row
    assert "0.750" in teamb and "75.0%" in teamb and "0.750" in total and "37.5%" in total, result.stdout


def test_the_json_keeps_every_cause_of_every_group(ledger_path):
    result = invoke("cost", "--no-refresh", "--causes", "--json", env={"HPCTRAIN_LEDGER": str(ledger_path)})
    rows = json.loads(result.stdout)
    assert [r["account"] for r in rows] == ["teama", "teamb"]
    assert all(set(r["cause_gpu_hours"]) >= set(LOST) and "queued_after_requeue_s" in r for r in rows)
    assert [r["idle_gpu_hours"] for r in rows] == [0.0, 0.75]



def test_idle_time_is_at_most_the_gpu_time_slurm_counted(ledger_path):
    """A sampler's clock counts the fraction of a second that Slurm's elapsed time (whole seconds) leaves out: a GPU
    idle its whole run reads 3600.4 s idle of a 3600 s run, and is counted idle 100 % of it, not more."""
    with Ledger(ledger_path) as ledger:
        ledger.db.execute("UPDATE gpu_use SET idle_s = 3600.4")
    result = invoke("cost", "--no-refresh", "--causes", "--json", env={"HPCTRAIN_LEDGER": str(ledger_path)})
    rows = json.loads(result.stdout)
    assert [(r["idle_gpu_hours"], r["gpu_hours"]) for r in rows] == [(0.0, 1.0), (1.0, 1.0)]


@pytest.fixture
def many_jobs(tmp_path):
    """30 jobs, job k (from 1) a run of k hours on one GPU."""
    now = time.time()
    with Ledger(tmp_path / "ledger.db") as ledger:
        for k in range(1, 31):
            job = Table(ledger, "jobs").insert({"name": f"j{k}", "site": "dev", "user": "alice", "account": "teama",
                                                "state": "COMPLETED"})
            ledger.attempts.record(job, -1, 1, state="COMPLETED", cause="completed", started_at=now - 3600 * k,
                                   ended_at=now, alloc_gpus=1, elapsed_s=3600 * k)
    return tmp_path / "ledger.db"


def first_cells(stdout: str) -> list[str]:
    return [line.split("│")[1].strip() for line in stdout.splitlines() if line.count("│") > 2]


def gpu_hours(stdout: str, label: str) -> float:
    (line,) = [line for line in stdout.splitlines() if line.count("│") > 2 and line.split("│")[1].strip() == label]
    return float(line.split("│")[4])


@pytest.mark.parametrize("top", [None, "5"])
def test_cost_by_job_shows_the_top_jobs_the_rest_in_a_line_and_the_total(many_jobs, top):
    env = {"HPCTRAIN_LEDGER": str(many_jobs), "COLUMNS": "160"}
    result = invoke("cost", "--no-refresh", "--by", "job", *(["--top", top] if top else []), env=env)
    assert result.exit_code == 0, result.output
    n = int(top or 20)
    cells = first_cells(result.stdout)
    assert cells == [str(k) for k in range(30, 30 - n, -1)] + [f"{30 - n} more (--all)", "total"]
    assert gpu_hours(result.stdout, f"{30 - n} more (--all)") == pytest.approx(sum(range(1, 31 - n)), abs=0.01)
    assert gpu_hours(result.stdout, "total") == pytest.approx(sum(range(1, 31)), abs=0.01)


def test_cost_by_job_shows_every_job_with_all_or_json(many_jobs):
    env = {"HPCTRAIN_LEDGER": str(many_jobs), "COLUMNS": "160"}
    shown = first_cells(invoke("cost", "--no-refresh", "--by", "job", "--all", env=env).stdout)
    assert shown == [str(k) for k in range(30, 0, -1)] + ["total"]
    rows = json.loads(invoke("cost", "--no-refresh", "--by", "job", "--json", env=env).stdout)
    assert sorted(r["job"] for r in rows) == list(range(1, 31))
