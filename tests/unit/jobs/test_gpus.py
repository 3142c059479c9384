"""How busy a job's GPUs were, from the node samplers' journal records to the ledger, `show`, `status --json` and
status's alerts (issue 61; the cluster tests feed records of real processes)."""

from __future__ import annotations

import json

from hpctrain.config.site import Alerts
from hpctrain.jobs.alerts import job_alerts
from hpctrain.jobs.gpus import idle_words, uses_of
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table
from hpctrain.runtime.utilization import Reading

from helpers.cli import run_cli
from helpers.gpus import GiB, FourGpus, sampled


def test_idle_gpus_are_named_in_the_ledger_status_show_and_alerts(isolated_ledger, tmp_path, monkeypatch):
    journal = Journal(tmp_path / "journal")
    with Ledger(isolated_ledger) as ledger:
        job = Table(ledger, "jobs").insert({"name": "ddp-forgotten", "site": "dev", "state": "RUNNING",
                                            "slurm_job_id": "77"})
        sampled(journal, job, 0, 600, monkeypatch)
        assert ingest_journal(ledger, journal) == 11
        rows = ledger.gpus.of_job(job)
        assert [(r["device"], r["kind"], r["node"], r["final"]) for r in rows] == [
            (d, "nvml", "n1", 1) for d in "0123"
        ]
        assert rows[0]["mean"] == 97 and rows[1]["mean"] == 0 and rows[1]["idle_s"] == rows[1]["seconds"] == 600
        assert rows[0]["energy_j"] == 400 * 600 and rows[0]["mem_peak"] == 30 * GiB
        minutes = ledger.gpus.timeline(job)
        assert len(minutes) in (10, 11) and {m.node for m in minutes} == {"n1"}  # 10 or 11 minutes, 4 GPUs each
        assert minutes[1].util == {"0": 97, "1": 0, "2": 0, "3": 0} and minutes[1].mem["0"] == 30 * 1024
        use = uses_of(ledger, [job])[job]
        assert round(use.mean, 2) == 24.25 and [g["device"] for g in use.idle] == ["1", "2", "3"] == [
            g["device"] for g in use.alerting
        ]
        said = idle_words(use, use.idle)
        assert said == "GPUs 1-3 of 4 under 5 % for 10 min: does the script use every GPU it asks for?"
        alerts = job_alerts(ledger, [ledger.jobs.get(job)], Alerts())
        assert alerts == {job: [f"idle GPUs: {said}"]}
        assert ingest_journal(ledger, journal) == 0  # read once
    shown = run_cli("show", str(job))
    assert shown.returncode == 0, shown.stderr
    assert "GPUs (nvml) 24 % on average: 0 97 %, 1 0 %, 2 0 %, 3 0 %; peak memory 30.0 of 80 GiB" in shown.stdout
    assert f"idle GPUs: {said}" in " ".join(shown.stdout.split())
    listed = run_cli("status", "--no-refresh", "--json")
    assert listed.returncode == 0, listed.stderr
    (status,) = json.loads(listed.stdout)
    assert status["gpus"]["idle"] == ["1", "2", "3"] and status["alerts"] == [f"idle GPUs: {said}"]
    assert [g["device"] for g in status["gpus"]["gpus"]] == ["0", "1", "2", "3"]


def test_a_newer_run_replaces_the_older_and_a_busy_job_has_no_alert(isolated_ledger, tmp_path, monkeypatch):
    journal = Journal(tmp_path / "journal")
    with Ledger(isolated_ledger) as ledger:
        job = Table(ledger, "jobs").insert({"name": "j", "site": "dev", "state": "RUNNING"})
        sampled(journal, job, 0, 300, monkeypatch)

        class Busy(FourGpus):
            def read(self):
                return [Reading(90.0, GiB, 80 * GiB)] * 4

        monkeypatch.setattr(FourGpus, "read", Busy.read)
        sampled(journal, job, 1, 120, monkeypatch)
        ingest_journal(ledger, journal)
        use = uses_of(ledger, [job])[job]
        assert {g["attempt"] for g in use.gpus} == {1} and use.idle == [] and use.mean == 90
        assert job_alerts(ledger, [ledger.jobs.get(job)], Alerts()) == {}


def test_gpus_busy_too_little_over_the_window_are_low_not_idle(isolated_ledger, tmp_path, monkeypatch):
    """A data-bound job: every GPU at 20 %, never idle; low over the window once the timeline covers it."""

    class Starved(FourGpus):
        def read(self):
            return [Reading(20.0, GiB, 80 * GiB)] * 4

    monkeypatch.setattr(FourGpus, "read", Starved.read)
    journal = Journal(tmp_path / "journal")
    with Ledger(isolated_ledger) as ledger:
        job = Table(ledger, "jobs").insert({"name": "starved", "site": "dev", "state": "RUNNING"})
        sampled(journal, job, 0, 1800, monkeypatch)
        ingest_journal(ledger, journal)
        row = ledger.jobs.get(job)
        assert job_alerts(ledger, [row], Alerts(gpu_low_percent=25, gpu_low_minutes=20)) == {
            job: ["low GPU use: 20 % on average over the last 20 min"]
        }
        assert job_alerts(ledger, [row], Alerts(gpu_low_percent=15, gpu_low_minutes=20)) == {}
        assert job_alerts(ledger, [row], Alerts(gpu_low_percent=25, gpu_low_minutes=60)) == {}  # not a whole window
