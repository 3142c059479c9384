"""Ending a run whose GPUs all stayed idle (`[idle] action = "cancel"`, issue 61): decided once across the step's
nodes, journaled before Slurm is asked, the same after a sampler killed at any point or two nodes deciding at once;
the run's end is `idle`, never requeued."""

from __future__ import annotations

import threading

import pytest

from hpctrain.contract import JOB_DIR_ENV, JobEnvironment
from hpctrain.ledger import Ledger
from hpctrain.ledger.ingest import ingest_journal
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table
from hpctrain.runtime import idle_cancel
from hpctrain.runtime.attempts import Outcome, decide, journal_outcomes
from hpctrain.runtime.idle_cancel import IdleCancel

GRACE_S = 120.0
RULE = '[idle] action = "cancel", cancel_minutes = 2'


def node_env(tmp_path, node: str, nodes: int = 2, restarts: int = 0) -> JobEnvironment:
    (tmp_path / "job").mkdir(exist_ok=True)
    return JobEnvironment({
        JOB_DIR_ENV: str(tmp_path / "job"), "SLURM_JOB_ID": "77", "SLURMD_NODENAME": node, "SLURM_RESTART_COUNT": "1",
        "SLURM_STEP_NUM_NODES": str(nodes), "HPCTRAIN_STEP_RESTART": str(restarts), "SLURM_PROCID": "0",
    })


class Cancels(list):
    """Slurm's side, as the sampler asks it: each target cancelled, or a failure for the first ``fail`` calls."""

    def __init__(self, fail: int = 0):
        super().__init__()
        self.fail = fail

    def __call__(self, target: str) -> None:
        if self.fail:
            self.fail -= 1
            raise OSError("scancel was killed")
        self.append(target)


def samplers(tmp_path, journal, cancels, nodes=("n1", "n2")):
    return [IdleCancel(node_env(tmp_path, n, len(nodes)), GRACE_S, RULE, journal, cancels) for n in nodes]


def decisions(journal: Journal) -> list[dict]:
    return [rec for _, rec in journal.records(kinds=("idle_cancel",))]


def test_the_run_ends_once_when_every_node_stayed_idle_past_the_grace(tmp_path):
    journal, cancels = Journal(tmp_path / "journal"), Cancels()
    one, two = samplers(tmp_path, journal, cancels)
    t = 1000.0
    assert not one.check(200.0, t)  # n1 idle long enough, n2 has not said
    assert not two.check(0.0, t)  # n2 works
    assert not two.check(60.0, t + 60)  # idle since t: not past the grace
    assert not one.check(260.0, t + 60)
    assert two.check(GRACE_S, t + GRACE_S) and one.check(GRACE_S + 200, t + GRACE_S)
    [decided] = decisions(journal)
    assert decided["cause"] == "idle" and decided["requeued"] is False and decided["nodes"] == 2
    assert decided["attempt"] == 1 and "cancel_minutes = 2" in decided["message"]
    assert cancels == ["77"]  # once: the second node found the decision made a moment ago


def test_a_node_that_works_again_keeps_the_run(tmp_path):
    journal, cancels = Journal(tmp_path / "journal"), Cancels()
    one, two = samplers(tmp_path, journal, cancels)
    assert not one.check(500.0, 1000.0)
    assert not two.check(10.0, 1000.0)
    assert not two.check(0.0, 1005.0)  # n2's GPU worked: its mark is gone
    assert not one.check(600.0, 1100.0 + GRACE_S)
    assert not decisions(journal) and not cancels
    assert not two.check(5.0, 1200.0)  # idle again: counted from then
    assert not one.check(900.0, 1200.0 + GRACE_S - 10)
    assert one.check(910.0, 1200.0 + GRACE_S) and len(decisions(journal)) == 1


def test_a_new_step_or_run_is_not_ended_by_the_marks_of_the_last(tmp_path):
    journal, cancels = Journal(tmp_path / "journal"), Cancels()
    old = IdleCancel(node_env(tmp_path, "n1", 2), GRACE_S, RULE, journal, cancels)
    assert not old.check(500.0, 1000.0)
    restarted = [IdleCancel(node_env(tmp_path, n, 2, restarts=1), GRACE_S, RULE, journal, cancels) for n in ("n2",)]
    assert not restarted[0].check(500.0, 1000.0)  # n1's mark is the first step's: one node of two
    assert not decisions(journal)


@pytest.mark.parametrize("killed", ["after the decision", "after the journal"])
def test_a_sampler_killed_at_each_step_is_seen_through_by_the_next(tmp_path, monkeypatch, killed):
    """Killed between the decision file and the journal, or between the journal and Slurm: the next reading past
    RESEND_S does what is missing, and the result is one clean run's: one record, the job cancelled."""
    journal, cancels = Journal(tmp_path / "journal"), Cancels(fail=1 if killed == "after the journal" else 0)
    one, two = samplers(tmp_path, journal, cancels)
    if killed == "after the decision":
        write = journal.write

        def dies(kind, **payload):
            monkeypatch.setattr(journal, "write", write)
            raise KeyboardInterrupt("killed")

        monkeypatch.setattr(journal, "write", dies)
    assert not one.check(GRACE_S, 1000.0)
    with pytest.raises((KeyboardInterrupt, OSError)):
        two.check(GRACE_S, 1000.0)
    assert len(decisions(journal)) == (killed == "after the journal") and not cancels
    assert one.check(GRACE_S + 10, 1010.0) and not cancels  # a moment later: taken as under way elsewhere
    later = (tmp_path / "job" / "idle" / "run1-ended").stat().st_mtime + idle_cancel.RESEND_S
    assert one.check(GRACE_S + 600, later)
    assert len(decisions(journal)) == 1 and cancels == ["77"]


def test_two_nodes_deciding_at_once_journal_and_cancel_once(tmp_path):
    journal, cancels = Journal(tmp_path / "journal"), Cancels()
    nodes = [f"n{i}" for i in range(8)]
    deciders = samplers(tmp_path, journal, cancels, nodes)
    for d in deciders:
        d.check(GRACE_S, 1000.0 - 1)  # every node marked, none past the grace yet
    go = threading.Barrier(len(deciders))

    def decide_now(d):
        go.wait()
        d.check(GRACE_S + 1, 1000.0 + 1)

    threads = [threading.Thread(target=decide_now, args=(d,)) for d in deciders]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(decisions(journal)) == 1 and cancels == ["77"]


def test_the_runs_end_is_idle_and_final_in_the_journal_and_the_ledger(tmp_path, isolated_ledger):
    journal, cancels = Journal(tmp_path / "journal"), Cancels()
    (one,) = samplers(tmp_path, journal, cancels, ("n1",))
    journal.write("attempt_start", attempt=1, task_index=-1, step=None)
    assert one.check(GRACE_S, 1000.0)
    runs = journal_outcomes(journal, -1)
    assert runs[1].cause == "idle"
    assert decide([Outcome("preemption"), runs[1]], requeue=True, on_error=True, max_stalled=3)[0] is False
    with Ledger(isolated_ledger) as ledger:
        job_id = Table(ledger, "jobs").insert({"name": "idle", "site": "dev", "state": "RUNNING", "spec_json": {},
                                               "lineage_json": {}})
        for path in journal.dir.iterdir():  # the records as this job's
            path.write_text(path.read_text().replace('"job_id": null', f'"job_id": {job_id}'))
        ingest_journal(ledger, journal)
        [run] = ledger.db.execute("SELECT cause, requeued, decision FROM attempts WHERE job_id = ?", [job_id])
    assert run[0] == "idle" and run[1] == 0 and "not requeued" in run[2]
