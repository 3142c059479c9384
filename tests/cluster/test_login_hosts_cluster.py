"""A site with two login nodes (helpers.hosts: their own host names, /tmp and /dev/shm; the home directory, job
folders and cluster shared) and the ledger at its default path in the home directory: a job submitted on one is
seen and followed from the other, writers on both lose nothing, a writer killed mid-transaction on either leaves
a ledger that reads and writes, and ticks from both submit each trial once."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers.cli import HPCTRAIN
from helpers.hosts import host_env, on_host
from helpers.paths import TESTS
from helpers.sweep import sweep_spec
from helpers.waiting import wait_until
from helpers.writers import WRITES

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
WRITER = (sys.executable, "-m", "helpers.writers")
HOSTS = ("login1", "login2")
# Runs until the file "go" appears in the shared home: it is still running when the other host first looks, however
# slow the machine is.
JOB = """name = "hosts"
command = ["sh", "-c", "until [ -e {home}/go ]; do sleep 0.2; done"]
launcher = "none"
[resources]
mem = "100M"
time = "00:05:00"
account = "teama"
"""


@pytest.fixture
def home():
    """A home directory both hosts see (under /var/tmp: each host has a /tmp of its own)."""
    folder = Path(tempfile.mkdtemp(prefix="hpctrain-hosts-", dir="/var/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def on(host: str, home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`hpctrain ARGS` on login host ``host``, run from ``home``."""
    return subprocess.run(on_host(host, *HPCTRAIN, *args), env=host_env(home), cwd=home, capture_output=True,
                          text=True, timeout=timeout)


def ledger_of(home: Path) -> Path:
    return home / ".local" / "share" / "hpctrain" / "ledger.db"


def test_a_job_submitted_on_one_login_host_is_seen_and_followed_from_the_other(dev_cluster, home):
    names = [subprocess.run(on_host(h, "sh", "-c", "hostname; ls /tmp | wc -l"), capture_output=True, text=True,
                            check=True).stdout.split() for h in HOSTS]
    assert names == [["login1", "0"], ["login2", "0"]]  # the hosts are apart: own names, empty /tmp of their own
    (home / "job.toml").write_text(JOB.format(home=home))
    submitted = on("login1", home, "submit", "job.toml", "--json")
    assert submitted.returncode == 0, submitted.stderr
    (job_id,) = json.loads(submitted.stdout)["ledger_ids"]
    seen = on("login2", home, "status", "--json")
    assert seen.returncode == 0, seen.stderr
    assert [r["id"] for r in json.loads(seen.stdout)] == [job_id]
    (home / "go").touch()

    def ended_on_login2() -> bool:
        rows = json.loads(on("login2", home, "status", "--all", "--json").stdout)
        return [(r["id"], r["state"]) for r in rows] == [(job_id, "COMPLETED")]

    wait_until(ended_on_login2, 120, 1, "login2 to see the job submitted on login1 complete")
    shown = on("login1", home, "show", str(job_id), "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["job"]["state"] == "COMPLETED", shown.stderr
    checks = {c["name"]: c for c in json.loads(on("login2", home, "doctor", "--json").stdout)}
    assert checks["ledger"]["verdict"] == "PASS" and checks["ledger"]["detail"].startswith(f"{ledger_of(home)} ")


def test_writers_on_both_hosts_lose_nothing_and_a_killed_one_leaves_a_ledger_that_works(dev_cluster, home):
    ledger = ledger_of(home)
    assert on("login1", home, "status").returncode == 0  # makes the ledger at the default path
    writers = [subprocess.Popen(on_host(HOSTS[n % 2], *WRITER, str(ledger), str(n)),
                                env=host_env(home, PYTHONPATH=str(TESTS)), stderr=subprocess.PIPE, text=True)
               for n in range(8)]
    errors = [w.communicate(timeout=300)[1] for w in writers]
    assert [w.returncode for w in writers] == [0] * 8, errors
    assert count_loads(ledger) == (8 * WRITES, 8 * WRITES)
    # kill -9 mid-write on either host: what was committed stays, the file checks out, and it takes writes again
    rng = random.Random(7)
    for n, host in enumerate(HOSTS, start=8):
        before = count_loads(ledger)[0]
        victim = subprocess.Popen(on_host(host, *WRITER, str(ledger), str(n), "100000"),
                                  env=host_env(home, PYTHONPATH=str(TESTS)))
        wait_until(lambda: count_loads(ledger)[0] > before + 50, 60, 0.05, f"the writer on {host} to write")
        time.sleep(rng.uniform(0, 0.2))
        victim.kill()
        victim.wait()
        with sqlite3.connect(ledger) as db:
            assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        again = subprocess.run(on_host(HOSTS[1 - HOSTS.index(host)], *WRITER, str(ledger),
                                       str(n + 10), "20"), env=host_env(home, PYTHONPATH=str(TESTS)), capture_output=True,
                               text=True, timeout=120)
        assert again.returncode == 0, again.stderr
    assert on("login2", home, "status", "--all").returncode == 0


def test_ticks_from_both_hosts_at_once_submit_each_trial_once(dev_cluster, home):
    stop = home / "stop"
    spec = sweep_spec(home, "hosts", 'method = "random"\nmax_trials = 8\nmax_parallel = 8\n'
                      '[search]\nx = { type = "uniform", low = -2.0, high = 2.0 }', steps=3000, step_s=0.1,
                      stop_file=stop)
    assert on("login1", home, "sweep", "start", str(spec), "--no-tick").returncode == 0
    ticks = [subprocess.Popen(on_host(HOSTS[n % 2], *HPCTRAIN, "sweep", "tick"), env=host_env(home), cwd=home,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for n in range(8)]
    outs = [t.communicate(timeout=300) for t in ticks]
    stop.touch()
    assert [t.returncode for t in ticks] == [0] * 8, [o[1] for o in outs]
    submitted = sorted(o[0].split(":")[1].split(",")[0].strip() for o in outs)
    assert submitted == ["0 submitted"] * 7 + ["8 submitted"], outs
    with sqlite3.connect(ledger_of(home)) as db:
        trials = db.execute("SELECT number, job_id, task_index FROM trials ORDER BY number").fetchall()
    assert [t[0] for t in trials] == list(range(8)) and len({t[1:] for t in trials}) == 8
    wait_until(lambda: on("login2", home, "sweep", "tick").returncode == 0 and trial_states(home) == {"completed"},
               180, 2, "the trials to end")


def count_loads(ledger: Path) -> tuple[int, int]:
    with sqlite3.connect(ledger, timeout=60) as db:
        return db.execute("SELECT count(*), count(DISTINCT message) FROM events WHERE kind = 'load'").fetchone()


def trial_states(home: Path) -> set[str]:
    with sqlite3.connect(ledger_of(home), timeout=60) as db:
        return {row[0] for row in db.execute("SELECT state FROM trials")}
