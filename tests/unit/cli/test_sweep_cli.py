"""`hpctrain sweep status|report|cron` on a ledger built here (tests/cluster/test_sweep_cluster.py runs real ticks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hpctrain.cli import cli
from hpctrain.ledger import Ledger
from hpctrain.ledger.table import Table
from hpctrain.sweep import store
from hpctrain.sweep.spec import load_sweep_spec

from helpers.cli import run_cli
from helpers.paths import REPO

SWEEP = """
name = "s1"
method = "random"
metric = "loss"
direction = "minimize"
max_trials = 4
[search]
x = { type = "uniform", low = -2.0, high = 2.0 }
y = { type = "uniform", low = -2.0, high = 2.0 }
[job]
name = "trial"
command = ["python", "train.py"]
"""


def make_sweep(ledger_path: Path, tmp_path: Path, values: list[float | None]) -> None:
    """Sweep s1 with one completed trial per value (None: its job completed without reporting the metric)."""
    spec = tmp_path / "sweep.toml"
    spec.write_text(SWEEP)
    with Ledger(ledger_path) as ledger:
        swp, _ = store.register(ledger, load_sweep_spec(spec), spec)
        job = Table(ledger, "jobs").insert({"name": "trial", "site": "dev", "state": "COMPLETED", "is_array": 1,
                                            "sweep_id": swp.id})
        for n, value in enumerate(values):
            Table(ledger, "trials").insert({"sweep_id": swp.id, "number": n, "params_json": {"x": n / 4, "y": -n / 8},
                                            "state": "completed", "job_id": job, "task_index": n, "value": value})


def test_status_says_no_completed_trial_reported_the_metric(isolated_ledger, tmp_path):
    make_sweep(isolated_ledger, tmp_path, [None, None])
    out = run_cli("sweep", "status", "s1")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == ("best: no completed trial reported the sweep's metric 'loss' (2 completed; "
                                           "a trial reports it with hpctrain.runtime.log_metrics)")


def test_report_names_every_missing_extra_at_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed: find_spec and import say so
    monkeypatch.setitem(sys.modules, "optuna", None)
    for args in (["sweep", "report", "s1"], ["report", "s1"]):
        done = CliRunner().invoke(cli, args)
        assert done.exit_code == 2
        assert done.output.endswith("needs matplotlib and optuna, which this install lacks: "
                                    "pip install 'hpctrain[report,sweep]'\n"), done.output


@pytest.mark.parametrize("values, importance", [
    ([1.0, 0.5, 2.0], ""),
    ([0.7], "parameter importance needs 2 completed trials with different values of loss (1 reported it, "
            "1 different value(s))"),
    ([None, None], "parameter importance needs 2 completed trials with different values of loss (0 reported it, "
                   "0 different value(s))"),
])
def test_report_writes_importance_or_says_why_not(isolated_ledger, tmp_path, values, importance):
    make_sweep(isolated_ledger, tmp_path, values)
    out = run_cli("sweep", "report", "s1", "--out", str(tmp_path / "plots"))
    assert out.returncode == 0, out.stderr
    metric, plot = tmp_path / "plots" / "metric.png", tmp_path / "plots" / "importance.png"
    assert out.stdout.splitlines() == [
        f"wrote {metric}" if any(v is not None for v in values) else f"{metric} not written: no completed trial "
                                                                      "reported loss",
        f"{plot} not written: {importance}" if importance else f"wrote {plot}"]
    assert plot.exists() == (not importance)
    if not importance:
        assert plot.read_bytes().startswith(b"\x89PNG")


DEV_CONF = "${HPCTRAIN_DEV_ROOT:-/var/tmp/hpctrain-dev}/etc/slurm.conf"
SLURM_UP = "#!/bin/sh\necho 'Slurmctld(primary) at fake is UP'\n"


def test_the_cron_line_ticks_in_a_bare_cron_environment(isolated_ledger, tmp_path):
    """Cron runs the line with sh, PATH=/usr/bin:/bin and little else: the line brings this shell's PATH (here
    where `scontrol` is), the ledger setting and this directory (a relative --site resolves in it)."""
    bin_dir, work = tmp_path / "slurm-bin", tmp_path / "work"
    bin_dir.mkdir()
    work.mkdir()
    for command, script in (("scontrol", SLURM_UP), ("sacct", "#!/bin/sh\n")):
        (bin_dir / command).write_text(script)
        (bin_dir / command).chmod(0o755)
    (tmp_path / "slurm.conf").touch()  # the fake commands' configuration: no dev cluster needed
    site = (REPO / "site_configs" / "dev.toml").read_text()
    (work / "site.toml").write_text(site.replace(DEV_CONF, str(tmp_path / "slurm.conf")))
    log = tmp_path / "logs" / "tick.log"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    line = subprocess.run([*[sys.executable, "-m", "hpctrain"], "sweep", "cron", "--site", "site.toml", "--every", "10",
                           "--log", str(log)], cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    schedule, command = line.split(" ", 5)[:5], line.split(" ", 5)[5]
    assert schedule == ["*/10", "*", "*", "*", "*"] and line.count("\n") == 1
    assert f"{sys.executable} -m hpctrain sweep tick --site site.toml;" in command
    bare = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "SHELL": "/bin/sh"}
    ran = subprocess.run(["/bin/sh", "-c", command.replace("\\%", "%")], cwd="/", env=bare, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0 and ran.stdout == ran.stderr == ""
    lines = log.read_text().splitlines()
    assert lines[0].startswith("== ") and lines[0].endswith(" sweep tick") and lines[1:] == ["== exit 0"]
    assert isolated_ledger.exists()  # the tick opened the ledger this shell names
