"""The attempts table: every run of a job or array task as sacct counts it, why it ended, and the decision
taken after it (requeued or stopped), with the queries GPU-hours and alerts read."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from hpctrain.ledger.rows import AttemptFields, AttemptRow, Interruptions, RunFacts
from hpctrain.ledger.schema import LOSES_WORK, LOSES_WORK_STATES
from hpctrain.ledger.table import Table, ids_json
from hpctrain.ledger.usage import scope

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from hpctrain.ledger.db import Ledger

PK = ("job_id", "task_index", "attempt")

# The runs of jobs not settled (their usage not kept in run_usage: `jobs_usage_unsettled`), or of given jobs.
_USAGE_SQL = """
SELECT a.job_id, a.task_index, a.attempt, a.alloc_gpus AS gpus, a.started_at, a.ended_at, a.elapsed_s, a.gpu_s,
       a.idle_gpu_s, a.cause,
       j.name, j.account, j.user, j.sweep_id, j.partition, j.site,
       json_extract(j.spec_json, '$.interactive') IS NOT NULL AS interactive,
       (SELECT max(c.created_at) FROM checkpoints c WHERE c.job_id = a.job_id AND c.task_index = a.task_index
        AND c.state IN ('committed', 'deleted') AND c.created_at BETWEEN a.started_at AND coalesce(a.ended_at, :now))
       AS last_checkpoint_at
FROM {jobs} JOIN attempts a ON a.job_id = j.id
WHERE a.started_at IS NOT NULL AND {where}
ORDER BY a.job_id, a.task_index, a.attempt
"""
_UNSETTLED = """j.site = :site AND j.usage_settled_at IS NULL AND (a.ended_at >= :since OR a.ended_at IS NULL)
  AND (:account IS NULL OR j.account = :account)"""
# The jobs not settled, and those of one job or sweep through their own keys (not every unsettled job's).
_UNSETTLED_OF = {
    "window": ("jobs j INDEXED BY jobs_usage_unsettled", _UNSETTLED),
    "job": ("jobs j", f"j.id = :job_id AND {_UNSETTLED}"),
    "sweep": ("jobs j INDEXED BY jobs_sweep", f"j.sweep_id = :sweep_id AND {_UNSETTLED}"),
}


def outcome(row: Mapping[str, Any]) -> str:
    """What came after a run (an attempts row): "requeued", "completed", "stopped", or "-" while undecided."""
    if row["requeued"] is None:
        return "-"
    if row["requeued"]:
        return "requeued"
    return "completed" if row["cause"] == "completed" else "stopped"


class Attempts:
    """Rows of `attempts`, keyed by (job id, task index, attempt number)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[AttemptRow] = Table(ledger, "attempts", PK)

    def record(self, job_id: int, task_index: int, attempt: int, **fields: Unpack[AttemptFields]) -> None:
        """Create or update one run's row with ``fields`` (Slurm's view, or the decision taken after it)."""
        self._rows.upsert({"job_id": job_id, "task_index": task_index, "attempt": attempt, **fields})

    def record_all(self, job_id: int, runs: Mapping[tuple[int, int], AttemptFields]) -> None:
        """Create or update many runs of one job at once, each keyed by (task index, attempt number)."""
        self._rows.upsert_all(
            {"job_id": job_id, "task_index": task, "attempt": attempt, **fields}
            for (task, attempt), fields in runs.items()
        )

    def of_task(self, job_id: int, task_index: int) -> list[AttemptRow]:
        return self._rows.rows("job_id = ? AND task_index = ?", [job_id, task_index], order_by="attempt")

    def of_job(self, job_id: int) -> list[AttemptRow]:
        return self._rows.rows("job_id = ?", [job_id], order_by="task_index, attempt")

    def drop_unstarted_from(self, job_id: int, task_index: int, attempt: int) -> None:
        """Runs from ``attempt`` on that never started nor were looked at: sacct listed them once and no longer
        does (a throttled array's task seen in its pending range and in a row of its own)."""
        with self.ledger.transaction() as db:
            db.execute(
                "DELETE FROM attempts WHERE job_id = ? AND task_index = ? AND attempt >= ? AND state = 'PENDING' "
                "AND started_at IS NULL AND step_start IS NULL AND cause IS NULL",
                [job_id, task_index, attempt],
            )

    def last_requeued(self, job_id: int) -> dict[int, int]:
        """Per task, the number of its last run that hpctrain requeued."""
        return dict(
            self.ledger.db.execute(
                "SELECT task_index, max(attempt) FROM attempts WHERE job_id = ? AND requeued = 1 GROUP BY task_index",
                [job_id],
            ).fetchall()
        )

    def fill_causes(self, job_id: int, cause_of_state: Mapping[str, str]) -> None:
        """Why each ended run ended, from its Slurm state, where nothing more precise was journaled for it."""
        pairs = sorted(cause_of_state.items())
        with self.ledger.transaction() as db:
            db.execute(
                f"UPDATE attempts SET cause = CASE state {' '.join('WHEN ? THEN ?' for _ in pairs)} END "
                f"WHERE job_id = ? AND cause IS NULL AND state IN ({','.join('?' * len(pairs))})",
                [*(x for pair in pairs for x in pair), job_id, *(state for state, _ in pairs)],
            )

    def decide_left_over(self, site: str, no_more_runs: Collection[str]) -> int:
        """Decide the runs nothing else decides on: a run that another run of its task followed was requeued; the
        last run of a plain job or array task now in one of ``no_more_runs`` (cancelled before it started, ...)
        runs no more. They leave `attempts_undecided`, which then holds the live runs only, and the site leaves
        `sites_to_decide` (`may_be_left_over`). Returns how many."""
        if not self.may_be_left_over(site):
            return 0  # the usual answer, one row read without taking the write lock
        (requeued_where, requeued_args), (stopped_where, stopped_args) = _left_over(site, no_more_runs)
        undecided = "UPDATE attempts AS a INDEXED BY attempts_undecided SET requeued = {}, decision = {} WHERE "
        with self.ledger.transaction() as db:
            requeued = db.execute(undecided.format(1, "'requeued by Slurm'") + requeued_where, requeued_args).rowcount
            stopped = db.execute(
                undecided.format(0, "'no more runs: ' || a.state") + stopped_where, stopped_args
            ).rowcount
            db.execute("DELETE FROM sites_to_decide WHERE site = ?", [site])  # in its transaction: nothing between
        return requeued + stopped

    def may_be_left_over(self, site: str) -> bool:
        """Whether a change since the last `decide_left_over` of ``site`` may have left a run of it to decide (the
        triggers of every such change add its site to `sites_to_decide`)."""
        return self.ledger.db.execute("SELECT 1 FROM sites_to_decide WHERE site = ?", [site]).fetchone() is not None

    def interruptions(self, site: str, partition: str, qos: str, gpus: int, since: float) -> Interruptions:
        """Runs that ended since ``since`` of jobs like one of ``gpus`` GPUs in ``partition`` and ``qos``: how many
        times they were interrupted so as to lose work (the runs that ended so, not on a notice that saved, and
        their job steps restarted in place), how many of those were restarts in place, over how many seconds of
        running."""
        causes, states = ", ".join("?" * len(LOSES_WORK)), ", ".join("?" * len(LOSES_WORK_STATES))
        ended, in_place, seconds = self.ledger.db.execute(
            f"""SELECT count(*) FILTER (WHERE a.cause IN ({causes})
                                        OR (a.cause IS NULL AND a.state IN ({states}))),
                       total((SELECT count(*) FROM segments s WHERE s.job_id = a.job_id
                                AND s.task_index = a.task_index AND s.attempt = a.attempt AND s.step_restart > 0)),
                       total(a.ended_at - a.started_at)
                FROM attempts a JOIN jobs j ON j.id = a.job_id
                WHERE j.site = ? AND j.partition = ? AND j.qos = ? AND a.alloc_gpus = ? AND a.ended_at >= ?
                  AND a.started_at IS NOT NULL""",
            [*LOSES_WORK, *LOSES_WORK_STATES, site, partition, qos, gpus, since],
        ).fetchone()
        return Interruptions(int(ended + in_place), int(in_place), seconds)

    def last_starts(self, job_ids: Iterable[int]) -> dict[int, float]:
        """When each job's latest run started (of those started): one statement."""
        rows = self.ledger.db.execute(
            "SELECT j.value, (SELECT max(started_at) FROM attempts WHERE job_id = j.value) FROM json_each(?) j",
            [ids_json(job_ids)],
        )
        return {job_id: started for job_id, started in rows if started is not None}

    def unsettled_usage(
        self,
        site: str,
        since: float,
        now: float,
        *,
        account: str | None = None,
        job_id: int | None = None,
        sweep_id: str | None = None,
    ) -> list[RunFacts]:
        """Every run overlapping [since, now] of the site's jobs not settled (of one account, job or sweep), with its
        job's facts and the time of its last checkpoint (committed, or committed and since deleted by retention)."""
        jobs, where = _UNSETTLED_OF[scope(job_id, sweep_id)]
        return self._facts(
            _USAGE_SQL.format(jobs=jobs, where=where),
            {"site": site, "now": now, "since": since, "account": account, "job_id": job_id, "sweep_id": sweep_id},
        )

    def usage_of(self, job_ids: Collection[int], now: float) -> list[RunFacts]:
        """Every started run of these jobs, as `unsettled_usage` gives them."""
        return self._facts(
            _USAGE_SQL.format(jobs="jobs j", where="a.job_id IN (SELECT value FROM json_each(:ids))"),
            {"now": now, "ids": ids_json(job_ids)},
        )

    def _facts(self, sql: str, params: dict[str, Any]) -> list[RunFacts]:
        return cast("list[RunFacts]", list(self.ledger.db.query(sql, params)))


def _left_over(site: str, no_more_runs: Collection[str]) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
    """The conditions (and their arguments) of the undecided runs that were requeued, and of those that run no more
    (`Attempts.decide_left_over`)."""
    marks = ",".join("?" * len(no_more_runs))
    later = "EXISTS (SELECT 1 FROM attempts b WHERE b.job_id = a.job_id AND b.task_index = a.task_index AND b.attempt > a.attempt)"
    of_site = "EXISTS (SELECT 1 FROM jobs j WHERE j.id = a.job_id AND j.site = ?)"
    ended = (
        "EXISTS (SELECT 1 FROM jobs j LEFT JOIN array_tasks t ON t.job_id = j.id AND t.task_index = a.task_index "
        f"WHERE j.id = a.job_id AND j.site = ? AND CASE WHEN a.task_index < 0 THEN j.is_array = 0 AND j.state IN "
        f"({marks}) ELSE t.state IN ({marks}) END)"
    )
    return (
        (f"requeued IS NULL AND {later} AND {of_site}", [site]),
        (f"requeued IS NULL AND NOT {later} AND {ended}", [site, *no_more_runs, *no_more_runs]),
    )
