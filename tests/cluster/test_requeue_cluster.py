"""Requeue policy on the dev cluster: the cap on runs without progress, runs that die without a word
(requeued by reconcile), preemption of one array task (only that task is requeued), a stop signal sent
to the batch shell alone, and a cancel (never requeued)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from hpctrain.config import load_site
from hpctrain.config.job import JobSpec
from hpctrain.jobs.reconcile import reconcile
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table
from hpctrain.slurm import SlurmClient
from hpctrain.submit import Submitter

from helpers.cli import run_cli
from helpers.cluster import finish, run_ends
from helpers.paths import REPO
from helpers.waiting import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SMALL = {"mem": "500M", "time": "00:10:00", "account": "teama"}


def submit(ledger: Ledger, spec: dict) -> dict:
    sub = Submitter(load_site("dev"), ledger).submit(JobSpec.model_validate(spec), "<test>")
    return ledger.jobs.get(sub.ledger_ids[0])


def killed_once(ledger: Ledger, tmp_path: Path, name: str) -> dict:
    """A job whose first run has its batch shell killed (as by the OOM killer: nothing in the job can requeue
    it), finished FAILED with its last attempt undecided; a second run completes."""
    marker = tmp_path / f"{name}-killed-once"
    kill_first_run = f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; kill -9 $PPID"
    job = submit(ledger, {"name": name, "command": ["bash", "-c", kill_first_run], "launcher": "none",
                          "resources": SMALL, "retry": {"on_error": True}})
    assert finish(ledger, job["id"]) == "FAILED"
    return job


def test_a_job_crashing_at_start_stops_after_the_cap(dev_cluster, isolated_ledger, tmp_path):
    with Ledger(isolated_ledger) as ledger:
        job = submit(ledger, {"name": "crasher", "command": [sys.executable, "-c", "raise SystemExit(7)"],
                              "launcher": "none", "resources": SMALL,
                              "checkpoint": {"dir": str(tmp_path / "ck")},
                              "retry": {"on_error": True, "max_stalled_attempts": 3}})
        assert finish(ledger, job["id"]) == "FAILED"
        assert run_cli("reconcile").returncode == 0
        attempts = ledger.attempts.of_job(job["id"])
    assert [(a["cause"], a["requeued"]) for a in attempts] == [("error", 1), ("error", 1), ("error", 0)]
    assert attempts[-1]["exit_code"] == "7:0"
    assert attempts[-1]["decision"].startswith("requeue cap: 3 consecutive attempts without checkpoint progress")
    shown = run_cli("show", str(job["id"]))
    assert "stopped after attempt 2: requeue cap: 3 consecutive attempts" in " ".join(shown.stdout.split())


def test_a_run_killed_without_a_word_is_requeued_by_reconcile_once(dev_cluster, isolated_ledger, tmp_path):
    """The batch shell is killed (as by the OOM killer): nothing in the job can requeue it; reconcile does,
    exactly once however often it runs, and the second run completes."""
    with Ledger(isolated_ledger) as ledger:
        job = killed_once(ledger, tmp_path, "killed")
        client = SlurmClient.for_site(load_site("dev"))
        first, second = reconcile(ledger, client, "dev"), reconcile(ledger, client, "dev")
        assert [(d.requeued, d.why.split(" by reconcile: ")[1]) for d in first.decisions] == \
            [(True, f"scontrol requeue {job['slurm_job_id']}")]
        assert second.decisions == []
        assert finish(ledger, job["id"], supervise=True) == "COMPLETED"
        attempts = ledger.attempts.of_job(job["id"])
    assert [(a["cause"], a["requeued"]) for a in attempts] == [("error", 1), ("completed", 0)]


def test_a_dead_run_slurm_has_forgotten_is_submitted_again_by_reconcile(dev_cluster, isolated_ledger, tmp_path):
    """Past MinJobAge Slurm no longer knows a job (here: the ledger points at an id Slurm never issued):
    reconcile submits the same script again under a new id, through the same path as the in-job requeue,
    and the ledger follows it with its runs numbered on."""
    with Ledger(isolated_ledger) as ledger:
        job = killed_once(ledger, tmp_path, "forgotten")
        Table(ledger, "jobs").update(job["id"], {"slurm_job_id": "99999999"})
        (decision,) = reconcile(ledger, SlurmClient.for_site(load_site("dev")), "dev").decisions
        new_id = ledger.jobs.get(job["id"])["slurm_job_id"]
        assert decision.requeued and decision.why.endswith(
            f"by reconcile: Slurm no longer holds 99999999: submitted again as {new_id}"), decision.why
        assert new_id not in ("99999999", job["slurm_job_id"])
        assert finish(ledger, job["id"], supervise=True) == "COMPLETED"
        attempts = ledger.attempts.of_job(job["id"])
    assert [(a["attempt"], a["cause"], a["requeued"]) for a in attempts] == [(0, "error", 1), (1, "completed", 0)]
    assert attempts[1]["slurm_job_id"] == new_id


def test_preempting_one_array_task_requeues_only_that_task(dev_cluster, isolated_ledger, tmp_path):
    """Two low tasks fill n1 and n2, a normal job holds n3: a one-node high job preempts exactly one task.
    That task saves its state on the notice and its batch script requeues it alone; both finish. (Each task runs
    60 s: with 30, on a loaded machine both once ended before Slurm placed the high job, which then preempted none.)"""
    steps = 300
    loop = REPO / "scripts" / "examples" / "guarded_loop.py"
    whole_node = {**SMALL, "gpus_per_node": 4, "tasks_per_node": 1, "time": "00:15:00"}
    with Ledger(isolated_ledger) as ledger:
        blocker = submit(ledger, {"name": "blocker", "command": ["sleep", "600"], "launcher": "none",
                                  "resources": {**whole_node, "qos": "normal"}})
        array = submit(ledger, {"name": "looped", "launcher": "none", "resources": {**whole_node, "preemptible": True},
                                "command": ["bash", "-c", f"exec {sys.executable} {loop} {tmp_path}/state-$SLURM_ARRAY_TASK_ID {steps}"],
                                "array": {"count": 2}})
        journal = Journal(Path(array["job_dir"]) / "journal")
        starts = lambda: [r for _, r in journal.records(kinds=["attempt_start"])]  # noqa: E731
        wait_until(lambda: len(starts()) == 2, 120, 0.5, "both tasks to start")
        submit(ledger, {"name": "urgent", "command": ["sleep", "1"], "launcher": "none",
                        "resources": {**whole_node, "qos": "high", "time": "00:02:00"}})
        assert finish(ledger, array["id"], timeout=240) == "COMPLETED"
        SlurmClient.for_site(load_site("dev")).scancel([blocker["slurm_job_id"]])
        assert run_cli("reconcile").returncode == 0
        tasks = {t["task_index"]: t for t in ledger.jobs.tasks(array["id"])}
        attempts = ledger.attempts.of_job(array["id"])
    assert sorted(t["restarts"] for t in tasks.values()) == [0, 1], (tasks, attempts)
    preempted = next(i for i, t in tasks.items() if t["restarts"] == 1)
    assert [(a["task_index"], a["cause"], a["requeued"]) for a in attempts if a["task_index"] == preempted][0] == \
        (preempted, "preemption", 1)
    for t in (0, 1):  # each task ran its steps exactly once across its runs
        assert json.loads((tmp_path / f"state-{t}").read_text()) == {"step": steps, "total": steps * (steps + 1) // 2}


def _catches_usr2(state: Path, slurm_job_id: str) -> bool:
    """Whether the guarded loop of job ``slurm_job_id`` writing ``state`` runs and has its USR2 handler (the guard's)
    in place (srun, whose command line names ``state`` too, does not count). The job's id, not only ``state``: the
    host's and each lane's run of this test see one another's processes, at the same ``state`` path in their trees."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            argv = (status.parent / "cmdline").read_bytes().decode(errors="replace").split("\0")
            environ = (status.parent / "environ").read_bytes().split(b"\0")
            if str(state) in argv and any(a.endswith("guarded_loop.py") for a in argv[:2]) \
                    and f"SLURM_JOB_ID={slurm_job_id}".encode() in environ:
                caught = next(ln for ln in status.read_text().splitlines() if ln.startswith("SigCgt:"))
                if int(caught.split()[1], 16) >> (signal.SIGUSR2 - 1) & 1:
                    return True
        except (OSError, StopIteration):
            continue
    return False


def test_a_stop_signal_sent_to_the_batch_shell_alone_reaches_srun_tasks_as_the_notice(dev_cluster, isolated_ledger,
                                                                                      tmp_path):
    """scancel --batch --signal=TERM: the shell passes USR2 on to srun (which answers a TERM by SIGKILLing its
    tasks); the loop saves its state at once, and the requeued run finishes it, every step exactly once."""
    loop = REPO / "scripts" / "examples" / "guarded_loop.py"
    state = tmp_path / "state"
    with Ledger(isolated_ledger) as ledger:
        job = submit(ledger, {"name": "termed", "command": [sys.executable, str(loop), str(state), "150"],
                              "resources": SMALL})
        journal = Journal(Path(job["job_dir"]) / "journal")
        wait_until(lambda: list(journal.records(kinds=["attempt_start"])), 60, 0.5, "the job to start")
        # Not a sleep: under CI's load the loop took more than 3 s to start, and a USR2 before its guard killed it.
        wait_until(lambda: _catches_usr2(state, job["slurm_job_id"]), 60, 0.2, "the loop to handle the notice")
        SlurmClient.for_site(load_site("dev")).scancel([job["slurm_job_id"]], signal="TERM", batch_only=True)
        saved = wait_until(lambda: state.exists() and json.loads(state.read_text()), 20, 0.2, "the state saved on TERM")
        assert 0 < saved["step"] < 150
        notice = Path(job["job_dir"]) / f"notice-{job['slurm_job_id']}.0"  # for a guard the signal missed
        assert notice.read_text().strip() == "TERM"
        assert finish(ledger, job["id"], timeout=240) == "COMPLETED"
    assert json.loads(state.read_text()) == {"step": 150, "total": 150 * 151 // 2}


def test_a_cancelled_job_is_not_requeued(dev_cluster, isolated_ledger, tmp_path):
    """scancel sends SIGTERM like a preemption without user signal: the job's state (ending, not requeued by
    Slurm) tells them apart, so the batch script does not bring a cancelled job back."""
    with Ledger(isolated_ledger) as ledger:
        job = submit(ledger, {"name": "tocancel", "command": ["sleep", "300"], "launcher": "none", "resources": SMALL})
        journal = Journal(Path(job["job_dir"]) / "journal")
        wait_until(lambda: list(journal.records(kinds=["attempt_start"])), 60, 0.5, "the job to start")
        assert run_cli("cancel", str(job["id"])).returncode == 0
        ends = wait_until(lambda: [r for _, r in journal.records(kinds=["attempt_end"])], 30, 0.5, "the run's end")
        assert (ends[0]["cause"], ends[0]["requeued"]) == ("cancelled", False)
        assert finish(ledger, job["id"]) == "CANCELLED"
        time.sleep(12)  # past cred_expire a requeued job would be back
        squeue = SlurmClient.for_site(load_site("dev")).run("squeue", "-h", "-j", job["slurm_job_id"])
    assert squeue.strip() == ""


def test_a_preempted_command_that_ignores_the_notice_does_its_work_once(dev_cluster, isolated_ledger, tmp_path):
    """A command that ignores the notice outlives QOS low's grace time, is killed, and runs again from the start.
    Slurm 24.11 then requeues that second run once more although it completed (sacct: PREEMPTED, PREEMPTED,
    COMPLETED): the third run ends at once, recorded as Slurm's own rerun, so the work is done once and the job
    counts one preemption; on the other releases there is no third run. Every run is decided by status alone."""
    done, release = tmp_path / "done", tmp_path / "release"
    # The work: waiting for the release (made once the second run has started), then the line in `done`.
    deaf = f'trap "" USR2 TERM HUP; until [ -e {release} ]; do sleep 1; done; echo "run $SLURM_RESTART_COUNT" >> {done}'
    with Ledger(isolated_ledger) as ledger:
        job = submit(ledger, {"name": "deaf", "command": ["bash", "-c", deaf], "launcher": "none",
                              "resources": {**SMALL, "gpus_per_node": 4, "tasks_per_node": 1, "preemptible": True}})
        journal = Journal(Path(job["job_dir"]) / "journal")
        wait_until(lambda: list(journal.records(kinds=["attempt_start"])), 120, 0.5, "the job to start")
        client = SlurmClient.for_site(load_site("dev"))
        node = client.show_job(job["slurm_job_id"])["NodeList"]
        client.sbatch("#!/bin/bash\nsleep 1\n", args=("-A", "teama", "--qos", "high", "--gres", "gpu:4", "-w", node,
                                                       "-t", "2", "--mem", "100M", "-o", "/dev/null"))
        wait_until(lambda: [r for _, r in journal.records(kinds=["attempt_start"]) if r["attempt"] == 1], 240, 0.5,
                   "the job's second run")
        release.touch()
        assert finish(ledger, job["id"], timeout=300) == "COMPLETED"
        assert run_cli("status").returncode == 0  # its polls decide every run, no reconcile (issue 58.4)
        attempts = ledger.attempts.of_job(job["id"])
        status = run_cli("status", "--all").stdout
        show = run_cli("show", str(job["id"])).stdout
    assert done.read_text() == "run 1\n"  # the second run did the work, and no other
    assert all(a["requeued"] is not None for a in attempts), attempts
    causes = [a["cause"] for a in attempts]
    assert causes in run_ends("preemption", "completed"), attempts
    if "rerun" in causes:  # 24.11's third run, said in words
        assert "Slurm started this run on its own" in " ".join(show.split()), show
    row = next(line for line in status.splitlines() if " deaf " in line)
    assert [c.strip() for c in row.split("│")][6:8] == [str(len(causes) - 1), "1"], row  # restarts, preempted once
