"""Status bookkeeping on recorded sacct output: attempts, requeues, array ranges, back-off."""

from hpctrain.jobs.poll import idle_gpu_seconds, next_interval
from hpctrain.slurm.parse import Parsable, parse_parsable_with_header
from hpctrain.slurm.sacct import by_job, digest, expand_task_range, histories
from hpctrain.slurm.states import array_state

# `sacct -X -D --parsable2` recorded on the dev cluster: a requeued job, an array mid-run, a preempted one.
RECORDED = """\
JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Reason
3|REQUEUED|0:0|2026-11-22T03:33:36|2026-11-22T03:33:36|2026-11-22T03:33:38|n1|billing=1,cpu=1,mem=1G,node=1|None
2_0|RUNNING|0:0|2026-11-22T03:33:36|2026-11-22T03:33:36|Unknown|n1|billing=1,cpu=1,gres/gpu=2,mem=1G,node=1|None
2_1|COMPLETED|0:0|2026-11-22T03:33:36|2026-11-22T03:33:36|2026-11-22T03:33:39|n1|billing=1,cpu=1,mem=1G,node=1|None
2_[2-4%2]|PENDING|0:0|2026-11-22T03:33:36|Unknown|Unknown|None assigned||JobArrayTaskLimit
3|PENDING|0:0|2026-11-22T03:33:39|Unknown|Unknown|None assigned||BeginTime
7|PREEMPTED|0:15|2026-11-22T03:50:20|2026-11-22T03:50:20|2026-11-22T03:50:42|n[1-3]|billing=48,cpu=48,gres/gpu=12,mem=3G,node=3|None
9|CANCELLED by 0|0:0|2026-11-22T03:50:53|2026-11-22T03:50:53|2026-11-22T03:52:23|n1|billing=1,cpu=1,mem=1G,node=1|None
"""


def test_histories_group_attempts_and_expand_pending_ranges():
    h = histories(parse_parsable_with_header(RECORDED))
    assert set(h) == {"2", "3", "7", "9"}
    assert [a.state for a in h["3"][-1].attempts] == ["REQUEUED", "PENDING"]
    assert h["3"][-1].restarts == 1 and h["3"][-1].state == "PENDING"
    assert sorted(h["2"]) == [0, 1, 2, 3, 4]
    assert h["2"][0].attempts[0].gpus == 2 and h["2"][0].state == "RUNNING"
    assert h["2"][3].state == "PENDING"
    assert h["9"][-1].state == "CANCELLED"



def test_sacct_text_is_grouped_by_job_and_parsed_only_when_read():
    """A poll of thousands of jobs groups sacct's lines by job id and digests them as text (issue 59); the rows
    read from them are the parsed ones, and a job's digest moves with its lines only."""
    text = RECORDED + "2_1.batch|COMPLETED|0:0|2026-11-22T03:33:36|2026-11-22T03:33:36|2026-11-22T03:33:39|n1||\n"
    grouped = by_job(Parsable.of(text))
    parsed = by_job(parse_parsable_with_header(RECORDED))
    assert set(grouped) == set(parsed) == {"2", "3", "7", "9"}
    assert {job: list(rows) for job, rows in grouped.items()} == parsed
    assert histories(grouped["2"])["2"][0].attempts == histories(parsed["2"])["2"][0].attempts
    again = by_job(Parsable.of(RECORDED.replace("2_0|RUNNING", "2_0|COMPLETED")))
    assert [job for job in grouped if digest(grouped[job]) != digest(again[job])] == ["2"]


# A throttled array (%3) recorded mid-run: task 6 has started and is still in the pending-range row too.
THROTTLED = """\
JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Reason
2_[6-11%3]|PENDING|0:0|2026-11-22T03:33:36|Unknown|Unknown|None assigned||JobArrayTaskLimit
2_5|COMPLETED|0:0|2026-11-22T03:33:36|2026-11-22T03:33:40|2026-11-22T03:33:44|n2|billing=1,cpu=1,mem=1G,node=1|None
2_6|RUNNING|0:0|2026-11-22T03:33:36|2026-11-22T03:33:45|Unknown|n1|billing=1,cpu=1,mem=1G,node=1|None
"""


def test_a_started_task_still_listed_in_the_pending_range_is_one_run():
    h = histories(parse_parsable_with_header(THROTTLED))["2"]
    assert sorted(h) == [5, 6, 7, 8, 9, 10, 11]
    assert [a.state for a in h[6].attempts] == ["RUNNING"] and h[6].restarts == 0 and h[6].state == "RUNNING"
    assert [a.state for a in h[7].attempts] == ["PENDING"]


# A job of 2 nodes and a spare (2 GPUs each) whose second node was set DOWN 8 s in (--no-kill): Slurm took it out
# of the allocation and records the run in two parts (recorded on 22.05). Then one still in its first part.
RESIZED = """\
JobID|State|ExitCode|Submit|Start|End|ElapsedRaw|NodeList|AllocTRES|Reason
2|RESIZING|0:0|2026-11-25T20:33:47|2026-11-25T20:33:47|2026-11-25T20:33:55|8|n[1-3]|billing=6,cpu=6,gres/gpu=6,mem=6G,node=3|None
2|COMPLETED|0:0|2026-11-25T20:33:47|2026-11-25T20:33:55|2026-11-25T20:33:58|3|n[1,3]|billing=4,cpu=4,gres/gpu=4,mem=4G,node=2|None
5|RESIZING|0:0|2026-11-25T20:40:00|2026-11-25T20:40:00|2026-11-25T20:40:09|9|n[1-3]|billing=6,cpu=6,gres/gpu=6,mem=6G,node=3|None
"""


def test_a_run_whose_allocation_shrank_is_one_run_with_the_gpu_seconds_of_its_parts():
    h = histories(parse_parsable_with_header(RESIZED))
    (run,) = h["2"][-1].attempts
    assert (run.state, run.node_list, run.gpus, run.elapsed_s, run.gpu_s) == ("COMPLETED", "n[1-3]", 6, 11, 6 * 8 + 4 * 3)
    assert run.end - run.start == 11 and h["2"][-1].restarts == 0
    # The spare's 2 GPUs waited the first 8 s; from then on they stood in for the failed node's.
    assert idle_gpu_seconds(run, spare_gpus=2) == 16 and idle_gpu_seconds(run, spare_gpus=0) == 0
    (going,) = h["5"][-1].attempts
    assert (going.state, going.end, going.gpu_s) == ("RUNNING", None, None)


def test_preempted_is_requeued_only_for_requeueable_jobs():
    h = histories(parse_parsable_with_header(RECORDED))["7"][-1]
    assert h.state == "REQUEUED" and h.attempts[0].gpus == 12
    h.requeue = False
    assert h.state == "PREEMPTED"


def test_task_ranges_and_array_state():
    assert expand_task_range("[2-4,7%2]") == [2, 3, 4, 7]
    assert array_state(["COMPLETED", "RUNNING", "PENDING"]) == "RUNNING"
    assert array_state(["COMPLETED", "REQUEUED"]) == "PENDING"
    assert array_state(["COMPLETED", "COMPLETED"]) == "COMPLETED"
    assert array_state(["COMPLETED", "FAILED"]) == "FAILED"
    assert array_state(["CANCELLED", "FAILED"]) == "CANCELLED"


def test_backoff_doubles_to_the_cap_and_resets_on_change():
    waits, wait = [], 5.0
    for changed in [False] * 8 + [True, False]:
        wait = next_interval(wait, 5.0, 300.0, changed)
        waits.append(wait)
    assert waits == [10, 20, 40, 80, 160, 300, 300, 300, 5, 10]


def test_status_shows_every_active_submission_an_array_split_in_parts_as_one(tmp_path):
    """Past the 200 rows `status --all` shows, every active job is there; the two jobs of an array split past
    MaxArraySize are one line with their tasks counted together."""
    from hpctrain.jobs.poll import job_summaries, submissions
    from hpctrain.ledger import Ledger

    with Ledger(tmp_path / "l.db") as ledger:
        for i in range(250):
            ledger.jobs.submitted(ledger.jobs.record({"name": f"plain-{i}", "site": "dev"}), str(100 + i))
        first = ledger.jobs.record({"name": "big", "site": "dev", "is_array": 1},
                                   [{"task_index": t, "param_index": t} for t in range(3)])
        second = ledger.jobs.record({"name": "big", "site": "dev", "is_array": 1, "group_id": first},
                                    [{"task_index": t, "param_index": 3 + t} for t in range(2)])
        for job, slurm_id, states in ((first, "900", ("RUNNING", "COMPLETED", "RUNNING")),
                                      (second, "901", ("PENDING", "PENDING"))):
            ledger.jobs.submitted(job, slurm_id)
            for t, state in enumerate(states):
                ledger.jobs.set_task_state(job, t, state, 1 if t == 0 else 0)
            ledger.jobs.set_state(job, array_state(list(states)))
        ledger.attempts.record(first, 0, 0, state="PREEMPTED", cause="preemption")
        ledger.attempts.record(first, 0, 1, state="RUNNING")
        ledger.attempts.record(second, 1, 0, state="PENDING")
        rows = submissions(job_summaries(ledger, "dev", active_only=True))
        assert len(job_summaries(ledger, "dev", limit=200)) == 200
    assert len(rows) == 251 and {r["name"] for r in rows[1:]} == {f"plain-{i}" for i in range(250)}
    big = rows[0]
    assert (big["id"], big["slurm_job_id"], big["state"], big["tasks"], big["task_states"]) == (
        first, "900,901", "RUNNING", 5, "COMPLETED:1,PENDING:2,RUNNING:2")
    assert (big["restarts"], big["preemptions"]) == (1, 1)


def test_a_poll_that_sees_a_job_end_decides_its_runs(tmp_path):
    """Slurm 24.11 runs a job that ignored a preemption's notice again, then once more after it completed (the third
    run exits at once): `status` alone, with no reconcile, leaves none of its runs undecided."""
    from hpctrain.jobs.poll import Poller
    from hpctrain.ledger import Ledger
    from hpctrain.ledger.table import Table

    class Slurm:
        def sacct(self, ids, fields):
            return parse_parsable_with_header(
                "JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Reason\n"
                "12|PREEMPTED|0:15|2026-11-27T06:00:00|2026-11-27T06:00:01|2026-11-27T06:10:00|n1||None\n"
                "12|COMPLETED|0:0|2026-11-27T06:10:00|2026-11-27T06:10:05|2026-11-27T06:20:00|n2||None\n"
                "12|COMPLETED|0:0|2026-11-27T06:20:00|2026-11-27T06:20:09|2026-11-27T06:20:10|n2||None\n")

    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert({"name": "a", "site": "dev", "slurm_job_id": "12", "state": "RUNNING",
                                      "spec_json": "{}"})
        Poller(ledger, Slurm(), "dev").refresh()
        assert ledger.jobs.get(1)["state"] == "COMPLETED"
        assert [(a["attempt"], a["requeued"], a["decision"]) for a in ledger.attempts.of_job(1)] == [
            (0, 1, "requeued by Slurm"), (1, 1, "requeued by Slurm"), (2, 0, "no more runs: COMPLETED")]


def test_a_run_left_by_another_writer_is_decided_by_the_next_poll_then_none_is_looked_for(tmp_path):
    """`cancel`, not the poll, ends a job whose run had not started: the next poll, with nothing new from Slurm,
    decides that run. Once none is left, a poll with nothing new reads the ledger's mark, not every live run (issue
    59: that check was 0.1 s of `status` on 2,000 active jobs)."""
    from hpctrain.jobs.poll import Poller
    from hpctrain.ledger import Ledger
    from hpctrain.ledger.table import Table

    class Slurm:
        def sacct(self, ids, fields):
            return parse_parsable_with_header(
                "JobID|State|ExitCode|Submit|Start|End|NodeList|AllocTRES|Reason\n"
                "13|RUNNING|0:0|2026-11-27T06:00:00|2026-11-27T06:00:01|Unknown|n1||None\n")

    with Ledger(tmp_path / "l.db") as ledger:
        for name, slurm_id, state in (("runs", "13", "RUNNING"), ("waits", "14", "PENDING")):
            Table(ledger, "jobs").insert({"name": name, "site": "dev", "slurm_job_id": slurm_id, "state": state,
                                          "spec_json": "{}"})
        poller = Poller(ledger, Slurm(), "dev")
        ledger.attempts.record(2, -1, 0, state="PENDING")
        poller.refresh()
        assert not ledger.attempts.may_be_left_over("dev")
        ledger.jobs.set_state(2, "CANCELLED")  # as `hpctrain cancel` does
        assert ledger.attempts.may_be_left_over("dev")
        poller.refresh()
        [run] = ledger.attempts.of_job(2)
        assert (run["requeued"], run["decision"]) == (0, "no more runs: PENDING")  # its last state
        assert not ledger.attempts.may_be_left_over("dev")
        statements: list[str] = []
        ledger.db.conn.set_trace_callback(statements.append)
        assert poller.refresh() == 0
        assert statements and not [s for s in statements if "attempts" in s], statements


def test_a_running_jobs_growing_elapsed_time_is_nothing_new_to_a_poll(tmp_path):
    """Issue 59: real sacct gives a running job's ElapsedRaw as it grows, so every running job's rows differed from
    the last poll's and were read and written again on every poll (1,334 of them on a heavy user's status; the
    benchmark's stand-ins had answered the same rows each time). Its end still is news."""
    from hpctrain.jobs.poll import Poller
    from hpctrain.ledger import Ledger
    from hpctrain.ledger.table import Table
    from hpctrain.slurm.sacct import FIELDS

    class Slurm:
        elapsed, end, state = 0, "Unknown", "RUNNING"

        def sacct(self, ids, fields):
            assert tuple(fields) == FIELDS
            Slurm.elapsed += 7
            row = {"JobID": "13", "State": self.state, "ExitCode": "0:0", "Submit": "2026-11-27T06:00:00",
                   "Start": "2026-11-27T06:00:01", "End": self.end, "NodeList": "n1",
                   "AllocTRES": "gres/gpu=4", "Reason": "None", "ElapsedRaw": str(Slurm.elapsed)}
            return Parsable.of("|".join(fields) + "\n" + "|".join(row[f] for f in fields) + "\n")

    with Ledger(tmp_path / "l.db") as ledger:
        Table(ledger, "jobs").insert({"name": "runs", "site": "dev", "slurm_job_id": "13", "state": "PENDING",
                                      "spec_json": "{}"})
        poller = Poller(ledger, Slurm(), "dev")
        assert poller.refresh() == 1
        before = ledger.db.conn.total_changes
        assert poller.refresh() == 0 and ledger.db.conn.total_changes == before
        Slurm.end, Slurm.state = "2026-11-27T06:09:00", "COMPLETED"
        assert poller.refresh() == 1
        [run] = ledger.attempts.of_job(1)
        assert (run["state"], run["elapsed_s"]) == ("COMPLETED", Slurm.elapsed)


def test_a_race_is_one_submission_in_its_winners_state_and_its_losers_are_cancelled_once(tmp_path):
    """`submit --race 2`: two runners in one group; once one has claimed the race, the other is cancelled by the
    poll (once: not again by the next poll before Slurm says so), and status shows the race as one submission in
    the state of the one that runs. A start alone decides nothing: the ledger may have a runner pending that has
    started meanwhile and claimed the race (a poll that cancelled by the ledger's states cancelled winners)."""
    from hpctrain.jobs.cancel import cancel_race_losers
    from hpctrain.jobs.poll import job_summaries, submissions
    from hpctrain.ledger import Ledger
    from hpctrain.ledger.table import Table

    class Slurm:
        cancelled: list[list[str]] = []

        def scancel(self, ids, *args, **kwargs):
            self.cancelled.append(ids)

    race_file = tmp_path / "race"
    with Ledger(tmp_path / "l.db") as ledger:
        jobs = Table(ledger, "jobs")
        for slurm_id, partition in (("21", "debug"), ("22", "gpu")):
            jobs.insert({"name": "raced", "site": "dev", "slurm_job_id": slurm_id, "state": "PENDING",
                         "race": str(race_file), "group_id": 1, "partition": partition, "spec_json": "{}"})
        slurm = Slurm()
        ledger.jobs.set_state(2, "RUNNING", started_at=100.0)
        assert cancel_race_losers(ledger, slurm, "dev") == [] and slurm.cancelled == []  # nobody has claimed it
        race_file.write_text("job 1\n")  # job 1 (slurm job 21) claimed it: 22 lost, however it looks in the ledger
        ledger.jobs.set_state(1, "RUNNING", started_at=100.5)
        [race] = submissions(job_summaries(ledger, "dev", active_only=True))
        assert (race["id"], race["slurm_job_id"], race["state"]) == (1, "21,22", "RUNNING")
        assert cancel_race_losers(ledger, slurm, "dev") == ["22"] and slurm.cancelled[-1] == ["22"]
        assert cancel_race_losers(ledger, slurm, "dev") == []  # asked once: the next poll sees it cancelled
        assert [e["kind"] for e in ledger.events.of_job(2)] == ["race_lost"]
        ledger.jobs.set_state(2, "CANCELLED", ended_at=101.0)
        ledger.jobs.set_state(1, "COMPLETED", ended_at=200.0)
        [race] = submissions(job_summaries(ledger, "dev"))
        assert race["state"] == "COMPLETED"  # the winner's, not the cancelled loser's
