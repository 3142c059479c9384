"""What checkpoints every "auto" steps learn from a task's own journal (runtime.attempts.interruption_history): the
interruptions that lost work, over all the time its runs ran, whoever recorded their end (issue 56.11)."""

from hpctrain.ledger.journal import Journal
from hpctrain.runtime.attempts import interruption_history, loses_work

T0 = 1_000_000.0


def write(journal: Journal, kind: str, attempt: int, at: float, task_index: int = -1, **payload: object) -> None:
    journal.write(kind, attempt=attempt, task_index=task_index, time=T0 + at, **payload)


def test_runs_ended_by_the_trainers_requeue_count_their_time_and_announced_stops_lose_nothing(tmp_path):
    """Run 1 stopped on a preemption notice and saved (the trainer's requeue: `attempt end` writes nothing after
    it), run 2 on the time limit; run 3 crashed; run 4 was killed without a word (the next run's start is all
    that tells), its newest checkpoint an hour in; run 5, the current one, restarted its job step in place once."""
    journal = Journal(tmp_path / "journal")
    write(journal, "attempt_start", 1, 0)
    write(journal, "requeue", 1, 7200, cause="preemption", checkpointed=True, step=700)
    write(journal, "attempt_start", 2, 8000)
    write(journal, "attempt_end", 2, 8000 + 3600, cause="timeout", step_end=1000)
    write(journal, "attempt_start", 3, 20_000)
    write(journal, "attempt_end", 3, 20_000 + 1800, cause="error", step_end=1000)
    write(journal, "attempt_start", 4, 30_000)
    write(journal, "checkpoint", 4, 30_000 + 3600, state="committed", step=1300)
    write(journal, "attempt_start", 5, 40_000)
    write(journal, "step_restart", 5, 40_000 + 600, step_restart=1)
    write(journal, "attempt_start", 1, 0, task_index=3)  # another array task's
    # the crash, the silent kill and the step restarted in place; 2 h + 1 h + 0.5 h + 1 h + 10 min of running
    assert interruption_history(journal, -1) == (3, 7200 + 3600 + 1800 + 3600 + 600)
    # the memory tier serves the restarts in place only
    assert interruption_history(journal, -1, in_place_only=True) == (1, 7200 + 3600 + 1800 + 3600 + 600)


def test_a_preemption_announced_but_not_saved_on_loses_work():
    assert not loses_work("preemption") and not loses_work("timeout") and not loses_work("completed")
    assert loses_work("preemption", checkpointed=False) and loses_work("requeued") and loses_work("hang")
