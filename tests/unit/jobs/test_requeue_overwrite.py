"""`sacct -X -D` rows that are not what they seem, replayed with the journal the runs wrote.

Slurm's requeue-while-COMPLETING bug (fixed upstream after 26.05.3; the same write path in 22.05 and 24.11): the
requeue overwrites the previous run's accounting row, its start missing and its restart count bumped. The journal
wins, and every run keeps its own facts and decision. And a job id Slurm gave before, to a job that accounting still
holds: that job's rows are none of this one's runs."""

from __future__ import annotations

from datetime import datetime

import pytest

from hpctrain.contract import JobPaths
from hpctrain.jobs.poll import Poller
from hpctrain.ledger import Ledger
from hpctrain.ledger.journal import Journal
from hpctrain.ledger.table import Table
from hpctrain.slurm.parse import Parsable, parse_parsable_with_header

HEADER = "JobID|State|ExitCode|Submit|Start|End|ElapsedRaw|NodeList|AllocTRES|Reason\n"
RUN_0 = "13|PREEMPTED|0:15|2026-11-27T06:00:00|2026-11-27T06:00:01|2026-11-27T06:10:00|599|n1|gres/gpu=2|None\n"
RUN_1 = "13|RUNNING|0:0|2026-11-27T06:10:00|2026-11-27T06:10:05|Unknown|0|n2|gres/gpu=2|None\n"
# Run 1 requeued while COMPLETING: the requeue's record in run 1's row, no start; run 2 then starts in that row.
OVERWRITTEN = "13|PENDING|0:0|2026-11-27T06:20:00|Unknown|Unknown|0|None assigned||BeginTime\n"
RUN_2_IN_ITS_ROW = "13|RUNNING|0:0|2026-11-27T06:20:00|2026-11-27T06:20:10|Unknown|0|n3|gres/gpu=2|None\n"
# Or the overwritten row stays, with no start, and run 2 gets a row of its own.
LEFT_WITHOUT_START = "13|REQUEUED|0:0|2026-11-27T06:20:00|Unknown|2026-11-27T06:20:00|0|n2|gres/gpu=2|None\n"
# Id 13 a week before, given to another job that accounting keeps: its controller has since started without its state.
EARLIER_JOB = "13|COMPLETED|0:0|2026-11-20T09:00:00|2026-11-20T09:00:02|2026-11-20T09:30:00|1798|n1|gres/gpu=1|None\n"


def at(clock: str) -> float:
    return datetime.fromisoformat(f"2026-11-27T{clock}").timestamp()


class Slurm:
    rows = ""
    text = False  # the rows as SlurmClient gives them (text, parsed when read), or parsed

    def sacct(self, ids, fields):
        return Parsable.of(HEADER + self.rows) if self.text else parse_parsable_with_header(HEADER + self.rows)


def journal_run(journal: Journal, attempt: int, started: str, ended: str | None = None) -> None:
    """What a run's batch script journals: its start, and its end with the decision taken."""
    journal.write("attempt_start", attempt=attempt, task_index=-1, step=0, time=at(started))
    if ended:
        journal.write("attempt_end", attempt=attempt, task_index=-1, cause="preemption", requeued=True, time=at(ended))


def runs(ledger: Ledger) -> list[tuple]:
    return [(a["attempt"], a["state"], a["started_at"], a["node_list"]) for a in ledger.attempts.of_job(1)]


def job(ledger: Ledger, tmp_path) -> Journal:
    Table(ledger, "jobs").insert({"name": "a", "site": "dev", "slurm_job_id": "13", "state": "RUNNING",
                                  "spec_json": "{}", "job_dir": str(tmp_path), "submitted_at": at("05:59:59")})
    return Journal(JobPaths(tmp_path).journal_dir)


def second_run_started(ledger: Ledger, tmp_path, slurm: Slurm) -> Journal:
    """The job's first run preempted and its second started, journaled and polled: its journal."""
    journal = job(ledger, tmp_path)
    journal_run(journal, 0, "06:00:03", "06:09:58")
    journal_run(journal, 1, "06:10:07")
    slurm.rows = RUN_0 + RUN_1
    Poller(ledger, slurm, "dev").refresh()
    return journal


def test_a_run_whose_row_the_requeue_overwrote_keeps_its_facts_and_the_next_run_its_number(tmp_path):
    slurm = Slurm()
    with Ledger(tmp_path / "l.db") as ledger:
        journal = second_run_started(ledger, tmp_path, slurm)
        assert runs(ledger) == [(0, "PREEMPTED", at("06:00:01"), "n1"), (1, "RUNNING", at("06:10:05"), "n2")]

        journal_run(journal, 1, "06:10:07", "06:19:58")
        slurm.rows = RUN_0 + OVERWRITTEN
        Poller(ledger, slurm, "dev").refresh()
        assert runs(ledger)[1:] == [(1, "RUNNING", at("06:10:05"), "n2"), (2, "PENDING", None, "None assigned")]

        journal_run(journal, 2, "06:20:12")
        slurm.rows = RUN_0 + RUN_2_IN_ITS_ROW
        Poller(ledger, slurm, "dev").refresh()
        assert runs(ledger)[1:] == [(1, "RUNNING", at("06:10:05"), "n2"), (2, "RUNNING", at("06:20:10"), "n3")]
        assert [(a["attempt"], a["requeued"]) for a in ledger.attempts.of_job(1)] == [(0, 1), (1, 1), (2, None)]
        assert ledger.jobs.get(1)["state"] == "RUNNING"


def test_a_row_left_without_a_start_before_later_runs_takes_no_runs_place(tmp_path):
    slurm = Slurm()
    with Ledger(tmp_path / "l.db") as ledger:
        journal = second_run_started(ledger, tmp_path, slurm)
        journal_run(journal, 1, "06:10:07", "06:19:58")
        journal_run(journal, 2, "06:20:12")
        slurm.rows = RUN_0 + LEFT_WITHOUT_START + RUN_2_IN_ITS_ROW
        Poller(ledger, slurm, "dev").refresh()
        assert runs(ledger)[1:] == [(1, "RUNNING", at("06:10:05"), "n2"), (2, "RUNNING", at("06:20:10"), "n3")]


def test_without_a_journal_sacct_is_read_as_before(tmp_path):
    slurm = Slurm()
    with Ledger(tmp_path / "l.db") as ledger:
        job(ledger, tmp_path)
        slurm.rows = RUN_0 + LEFT_WITHOUT_START + RUN_2_IN_ITS_ROW
        Poller(ledger, slurm, "dev").refresh()
        assert [a["attempt"] for a in ledger.attempts.of_job(1)] == [0, 1, 2]


@pytest.mark.parametrize("text", [True, False], ids=["text", "parsed"])
def test_an_earlier_job_under_the_same_id_is_none_of_its_runs(tmp_path, text):
    slurm = Slurm()
    slurm.text = text
    with Ledger(tmp_path / "l.db") as ledger:
        job(ledger, tmp_path)
        slurm.rows = EARLIER_JOB + RUN_0 + RUN_1
        Poller(ledger, slurm, "dev").refresh()
        assert runs(ledger) == [(0, "PREEMPTED", at("06:00:01"), "n1"), (1, "RUNNING", at("06:10:05"), "n2")]
        assert ledger.jobs.get(1)["state"] == "RUNNING"
