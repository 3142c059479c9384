"""Sweeps ticked from Slurm's scrontab (`hpctrain sweep install-tick --scrontab`: a job on a compute node each
minute) while a login node's ticks overlap it: every trial is submitted once and runs once, and a trial submitted
from the tick's job inherits none of that job's Slurm variables; the ledger on a local disk, or on the Gluster home
that `doctor --ledger` accepted (issue 60: the tick on the compute node finds that verdict through the state folder
its entry carries). Needs the scrontab command: the lanes have it, Debian 12's slurm-client 22.05 (the host's there)
has not."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.sweep import install
from hpctrain.sweep.install import BEGIN, END

from helpers.cli import HPCTRAIN, run_cli
from helpers.gluster import gluster_up, second_client
from helpers.hosts import on_host
from helpers.lanes import lanes
from helpers.sweep import kept_table, sweep_spec
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
GRID = 'method = "grid"\nmax_parallel = 2\n[search]\nx = {{ type = "choice", values = {values} }}\ny = {{ type = "choice", values = [0.0] }}'


@pytest.fixture
def scrontab():
    """The user's scrontab, given back as it was after the test."""
    with kept_table("scrontab", "no scrontab command here (Debian 12's slurm-client 22.05 has none): the Slurm lanes "
                    "run this test"):
        yield


@pytest.fixture(params=[
    pytest.param("local disk", marks=lanes("26.05", why="24.11 runs it with the ledger on the Gluster home")),
    pytest.param("gluster", marks=lanes("24.11", why="the file system's, not Slurm's: 26.05 runs it on a local disk")),
])
def ledger_at(request, isolated_ledger, monkeypatch):
    """The test's ledger: on a local disk, or on the safe Gluster volume with the state folder beside it (set in
    this shell only, as a user's profile would), accepted there by `doctor --ledger` from a second login host."""
    if request.param == "local disk":
        yield isolated_ledger
        return
    folder = Path(tempfile.mkdtemp(prefix="hpctrain-scron-", dir=gluster_up() / "safe" / "a"))
    path = folder / "ledger.db"
    monkeypatch.setenv("HPCTRAIN_LEDGER", str(path))
    monkeypatch.setenv("XDG_STATE_HOME", str(folder / "state"))
    # probed from a second login host, which sees the volume through a Gluster client of its own (helpers.hosts)
    probed = subprocess.run(on_host("login2", *HPCTRAIN, "doctor", "--ledger", "--json", binds=second_client("safe")),
                            capture_output=True, text=True, timeout=300)
    checks = {c["name"]: c for c in json.loads(probed.stdout)}
    assert probed.returncode == 0 and checks["ledger probe"]["verdict"] == "PASS", probed.stdout + probed.stderr
    yield path
    with sqlite3.connect(path, timeout=60) as db:
        ids = [r[0] for r in db.execute("SELECT slurm_job_id FROM jobs WHERE slurm_job_id IS NOT NULL")]
    subprocess.run(["scancel", *ids], capture_output=True)
    shutil.rmtree(folder, ignore_errors=True)


def tick_runs(since: str) -> list[list[str]]:
    """The scrontab tick job's runs since ``since`` that got a node, in accounting: JobID, State, NodeList."""
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State,NodeList", "--name",
                          "hpctrain-sweep-tick", "-S", since], capture_output=True, text=True, check=True)
    return [row for row in (line.split("|") for line in out.stdout.splitlines()) if row[2] != "None assigned"]


def test_scrontab_and_login_ticks_overlapping_submit_each_trial_once(dev_cluster, tmp_path, scrontab, ledger_at):
    # Trials of 40 s, two at a time: each sweep is still running at the scrontab job's next minute.
    specs = [sweep_spec(tmp_path, "scron-a", GRID.format(values="[0.0, 0.5, 1.0, 1.5]"), steps=400),
             sweep_spec(tmp_path, "scron-b", GRID.format(values="[0.0, 1.0, 2.0]"), steps=400)]
    for spec in specs:
        assert run_cli("sweep", "start", str(spec), "--no-tick").returncode == 0
    log = tmp_path / "tick.log"
    before = install.read("scrontab")  # the user's, a tick block of an earlier install included
    shown = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--scrontab", "--every", "1", "--log", str(log),
                            "--dry-run"], cwd=tmp_path, capture_output=True, text=True)
    assert shown.returncode == 0 and "#SCRON --job-name=hpctrain-sweep-tick" in shown.stdout, shown.stderr
    assert install.read("scrontab") == before  # the dry run wrote nothing
    done = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--scrontab", "--every", "1", "--log", str(log)],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0 and "as a Slurm job on a compute node" in done.stdout, done.stderr
    assert install.read("scrontab") == shown.stdout.split("\n", 1)[1]
    since = time.strftime("%Y-%m-%dT%H:%M:%S")

    # The first trials come from the scrontab job's tick; then this login node ticks every few seconds beside it,
    # overlapping its next ticks, until both sweeps are done and the scrontab job has ticked again.
    wait_until(lambda: log.exists() and "== exit" in log.read_text(), 150, 1, "the scrontab job's first tick")
    first = log.read_text()
    assert "sweep scron-a: 2 submitted" in first and "sweep scron-b: 2 submitted" in first and "== exit 0" in first

    def ticked_to_the_end() -> str | None:
        """The log once both sweeps are done and the scrontab job has ticked again, read with no tick under way
        (the next minute's may begin at any moment: its header is in the log before its exit)."""
        login = run_cli("sweep", "tick")
        assert login.returncode == 0, login.stderr
        time.sleep(3)
        text = log.read_text()
        settled = text.count("== exit") == text.count(" sweep tick\n")
        return text if settled and text.count("== exit 0") >= 2 and _states(ledger_at) == {"completed"} else None

    ticks = wait_until(ticked_to_the_end, 300, 0, "both sweeps to end and the scrontab job to tick again")
    assert ticks.count("== exit 0") == ticks.count(" sweep tick\n"), ticks
    ran = tick_runs(since)
    assert len(ran) >= 2 and all(node.startswith("n") for _, _, node in ran), ran

    with Ledger(ledger_at) as ledger:
        trials = Table(ledger, "trials").rows(order_by="sweep_id, number")
        jobs = {j["id"]: j for s in ("scron-a", "scron-b") for j in ledger.jobs.of_sweep(s)}
    assert [(t["sweep_id"], t["number"]) for t in trials] == [("scron-a", n) for n in range(4)] + [
        ("scron-b", n) for n in range(3)]
    # Each trial in one job (array task) of its own sweep, run once, numbered as a first run (a trial submitted
    # from the tick's job would otherwise take that job's SLURM_RESTART_COUNT as its own), and so in accounting.
    assert len({(t["job_id"], t["task_index"]) for t in trials}) == 7
    with Ledger(ledger_at) as ledger:
        runs = [[a["attempt"] for a in ledger.attempts.of_task(t["job_id"], t["task_index"])] for t in trials]
    assert runs == [[0]] * 7, runs
    for job in jobs.values():
        sacct = subprocess.run(["sacct", "-X", "-D", "-n", "-P", "-o", "JobID,State", "-j", job["slurm_job_id"]],
                               capture_output=True, text=True, check=True).stdout.split()
        assert sacct and all(row.endswith("|COMPLETED") for row in sacct), sacct
        assert len(sacct) == len({row.split("|")[0] for row in sacct}), sacct  # no task ran twice
    # Taken out again, the rest of the table is left as it was.
    removed = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--scrontab", "--remove"], cwd=tmp_path,
                             capture_output=True, text=True)
    assert removed.returncode == 0 and "taken out" in removed.stdout, removed.stderr
    assert "hpctrain" not in install.read("scrontab")


def test_a_refused_value_leaves_the_scrontab_as_it_was_and_a_normal_install_ticks(dev_cluster, tmp_path, scrontab):
    """A working directory or --log that would add an entry of its own to the table (57.1) is refused, installing
    or removing, and the table stays as it was; installed from a plain directory, the entry ticks, and goes again."""
    mine = "# hpctrain cluster test: a line of the user's own\n"
    install.write("scrontab", mine)
    marker = tmp_path / "marker"
    hostile = tmp_path / f"x\n* * * * * touch {marker} #"
    hostile.mkdir(parents=True)
    log = tmp_path / "tick.log"
    for cwd, args in ((hostile, []), (tmp_path, ["--log", f"{tmp_path}/l\u2028* * * * * touch {marker} #"])):
        for more in ([], ["--dry-run"]):
            refused = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--scrontab", "--every", "1", *args, *more],
                                     cwd=cwd, capture_output=True, text=True)
            assert refused.returncode == 2 and refused.stdout == "", refused.stdout
            assert len(refused.stderr.splitlines()) == 1 and "cannot carry" in refused.stderr, refused.stderr
        assert install.read("scrontab") == mine
    removed = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--scrontab", "--remove"], cwd=hostile,
                             capture_output=True, text=True)
    assert removed.returncode == 0 and "already without" in removed.stdout, removed.stderr
    assert install.read("scrontab") == mine

    done = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--scrontab", "--every", "1", "--log", str(log)],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    table = install.read("scrontab").split("\n")
    assert table[:3] == [mine[:-1], "", BEGIN] and table[-2:] == [END, ""] and len(table) == 7, table
    wait_until(lambda: log.exists() and "== exit" in log.read_text(), 150, 1, "the scrontab job's first tick")
    assert "== exit 0" in log.read_text() and not marker.exists()
    removed = subprocess.run([*HPCTRAIN, "sweep", "install-tick", "--scrontab", "--remove"], cwd=tmp_path,
                             capture_output=True, text=True)
    assert removed.returncode == 0 and "taken out" in removed.stdout, removed.stderr
    assert install.read("scrontab") == mine


def _states(ledger_path: Path) -> set[str]:
    with Ledger(ledger_path) as ledger:
        return {t["state"] for t in Table(ledger, "trials").rows()}
