"""The jobs table and its array tasks: a submission's rows, their states, and the queries over them.

States are Slurm's (plus SUBMITTING, SUBMIT_FAILED, REQUEUED); which are final is Slurm's vocabulary
(`hpctrain.slurm.states`), passed in by the callers so that the ledger stays a leaf.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from hpctrain.errors import LedgerError
from hpctrain.ledger.rows import ArrayTaskRow, JobRow, JobSummary, JobTimes, NewJob, NewTask, SubmittedJob
from hpctrain.ledger.schema import EVAL_ON_CHECKPOINT
from hpctrain.ledger.table import Table, ids_json

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from hpctrain.ledger.db import Ledger


# A job's journal is complete when its batch script exits, before Slurm reports the end; this leaves room for a
# shared file system's attribute caches (an NFS client's can lag by up to a minute). Ledger v10's partial index
# jobs_journal_unsettled spells the same number.
JOURNAL_SETTLE_S = 60
# Journals of jobs that ended within this long are read until they have settled; older ones no more.
JOURNALS_READ_S = 7 * 86400


def _marks(values: Collection[Any]) -> str:
    return ",".join("?" * len(values))


_SUMMARY_SQL = """
SELECT j.id, j.name, j.site, j.slurm_job_id, j.state, j.account, j.qos, j.partition, j.is_array, j.group_id, j.race,
       j.sweep_id, j.submitted_at, j.started_at, j.ended_at,
       (SELECT count(*) FROM array_tasks t WHERE t.job_id = j.id) AS tasks,
       (SELECT group_concat(state || ':' || n) FROM (SELECT state, count(*) AS n FROM array_tasks t
            WHERE t.job_id = j.id GROUP BY state)) AS task_states,
       (SELECT count(*) - count(DISTINCT a.task_index) FROM attempts a WHERE a.job_id = j.id) AS restarts,
       (SELECT count(*) FROM attempts a WHERE a.job_id = j.id
            AND (a.cause = 'preemption' OR (a.cause IS NULL AND a.state = 'PREEMPTED'))) AS preemptions
FROM jobs j {index}
WHERE j.site = ? {where}
ORDER BY j.id DESC
LIMIT ?
"""


class Jobs:
    """Rows of `jobs` (one per sbatch) and `array_tasks` (one per task of an array job)."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger
        self._rows: Table[JobRow] = Table(ledger, "jobs")
        self._tasks: Table[ArrayTaskRow] = Table(ledger, "array_tasks", ("job_id", "task_index"))

    def get(self, job_id: int) -> JobRow | None:
        return self._rows.get(job_id)

    def known(self, job_id: int) -> JobRow:
        """A job whose id came from the ledger; LedgerError if it is not there (any more)."""
        if (job := self.get(job_id)) is None:
            raise LedgerError(f"{self.ledger.path}: no job {job_id} in the ledger")
        return job

    def by_slurm_id(self, site: str, slurm_job_id: str) -> SubmittedJob | None:
        return cast("SubmittedJob | None", self._rows.first("site = ? AND slurm_job_id = ?", [site, slurm_job_id]))

    def record(self, row: NewJob, tasks: Iterable[NewTask] = ()) -> int:
        """A new submission's row, in state SUBMITTING, with its array tasks; the first job of a submission
        is its own group. Returns the ledger id."""
        with self.ledger.transaction():
            job_id = self._rows.insert({**row, "state": "SUBMITTING", "updated_at": time.time()})
            if row.get("group_id") is None:
                self._rows.update(job_id, {"group_id": job_id})
            now = time.time()
            self._tasks.insert_all({**t, "job_id": job_id, "updated_at": now} for t in tasks)
        return job_id

    def set_script(self, job_id: int, path: str, job_dir: str, sha256: str) -> None:
        """The job's batch script (its path and SHA-256) and directory, once written."""
        self._rows.update(job_id, {"script_path": path, "job_dir": job_dir, "script_sha256": sha256})

    def submitted(self, job_id: int, slurm_job_id: str, at: float | None = None) -> None:
        """Slurm took the job: now, or for a submission found again after its submitter died, no earlier than ``at``
        (when the job was recorded). Slurm's rows under its id from before then are another job's (`Poller`)."""
        now = time.time()
        self._rows.update(
            job_id,
            {"slurm_job_id": slurm_job_id, "state": "PENDING", "submitted_at": at or now, "updated_at": now},
        )

    def submit_failed(self, job_id: int, error: str) -> None:
        self._rows.update(job_id, {"state": "SUBMIT_FAILED", "error": error, "updated_at": time.time()})

    def resubmitted(self, job_id: int, slurm_job_id: str, attempt_base: int) -> None:
        """The job goes on under a new Slurm id (its script submitted again), its runs numbered on from
        ``attempt_base``."""
        self._rows.update(job_id, {"slurm_job_id": slurm_job_id, "attempt_base": attempt_base})

    def polled(self, digests: Mapping[int, str]) -> None:
        """What sacct said of these jobs, folded in (job id -> digest of its rows): the next poll skips a job whose
        rows are the same, until something else changes it (schema v15's triggers forget the digest)."""
        with self.ledger.transaction() as db:
            db.conn.executemany("UPDATE jobs SET sacct_digest = ? WHERE id = ?", [(d, i) for i, d in digests.items()])

    def set_state(self, job_id: int, state: str, **times: Unpack[JobTimes]) -> None:
        """A new state from Slurm or from hpctrain's own decision, with its start and end where they change with it."""
        self._rows.update(job_id, {"state": state, **times, "updated_at": time.time()})

    def active(self, site: str, final: Collection[str]) -> list[SubmittedJob]:
        """Submitted jobs of the site not in a ``final`` state (none of which has ended: `jobs_open` indexes them)."""
        rows = self._rows.rows(
            f"site = ? AND ended_at IS NULL AND slurm_job_id IS NOT NULL AND state NOT IN ({_marks(final)})",
            [site, *sorted(final)],
            index="jobs_open",
        )
        return cast("list[SubmittedJob]", rows)

    def following_checkpoints(self, site: str, final: Collection[str], ended_since: float) -> list[int]:
        """Ids of the site's jobs whose spec says `[eval] on_checkpoint`: the submitted ones not in a ``final``
        state, then those that ended at or after ``ended_since`` (`jobs_eval_on_checkpoint` indexes them)."""
        which = f"FROM jobs INDEXED BY jobs_eval_on_checkpoint WHERE site = ? AND {EVAL_ON_CHECKPOINT}"
        rows = self.ledger.db.execute(
            f"SELECT id {which} AND ended_at IS NULL AND slurm_job_id IS NOT NULL AND state NOT IN ({_marks(final)}) "
            f"UNION ALL SELECT id FROM (SELECT id {which} AND ended_at >= ? ORDER BY id)",
            [site, *sorted(final), site, ended_since],
        )
        return [r[0] for r in rows]

    def journals_to_read(self, site: str, final: Collection[str], ended_since: float) -> dict[str, list[int]]:
        """The job directories whose journals may still grow: of active jobs, and of jobs that ended since
        ``ended_since`` whose journal has not been read ``JOURNAL_SETTLE_S`` after their end; each with the
        ids of those ended jobs (to pass to `journals_read` once read)."""
        rows = self.ledger.db.query(
            f"SELECT NULL AS id, job_dir FROM jobs INDEXED BY jobs_open WHERE site = ? AND ended_at IS NULL AND job_dir IS NOT NULL "
            f"AND state NOT IN ({_marks(final)}) "
            "UNION ALL SELECT id, job_dir FROM jobs WHERE site = ? AND ended_at >= ? AND job_dir IS NOT NULL "
            f"AND (journal_read_at IS NULL OR journal_read_at < ended_at + {JOURNAL_SETTLE_S})",
            [site, *sorted(final), site, ended_since],
        )
        dirs: dict[str, list[int]] = {}
        for r in rows:
            dirs.setdefault(r["job_dir"], []).extend([r["id"]] if r["id"] is not None else [])
        return dirs

    def journals_read(self, ids: Collection[int], at: float) -> None:
        """Note that the journals of these ended jobs were read at ``at``."""
        ids = list(ids)
        if not ids:
            return  # no write transaction: on a shared file system each is lock and sync round trips
        with self.ledger.transaction():
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                self.ledger.db.execute(f"UPDATE jobs SET journal_read_at = ? WHERE id IN ({_marks(part)})", [at, *part])

    def summaries(
        self, site: str, final: Collection[str], active_only: bool = False, limit: int = 200
    ) -> list[JobSummary]:
        """One row per job, newest first, with array task counts, restarts and preemptions (one query); a run that
        requeued itself on a preemption notice counts as preempted, as one Slurm ended PREEMPTED does (unless it
        journaled another end: 24.11 records a run that completed after a preemption PREEMPTED too)."""
        # The plans fixed whatever the statistics: the open jobs' index, or the newest rows first, up to the limit.
        index, where, args = "NOT INDEXED", "", [site]
        if active_only:
            index, where = "INDEXED BY jobs_open", f"AND j.ended_at IS NULL AND j.state NOT IN ({_marks(final)})"
            args += sorted(final)
        sql = _SUMMARY_SQL.format(index=index, where=where)
        return cast("list[JobSummary]", list(self.ledger.db.query(sql, [*args, limit])))

    def unsent(self, site: str) -> list[JobRow]:
        """The site's jobs recorded for submission whose sbatch answer is not recorded (hpctrain.jobs.unsent): a
        seek of `jobs_open` to (site, 'SUBMITTING')."""
        return self._rows.rows("site = ? AND state = 'SUBMITTING' AND ended_at IS NULL", [site], index="jobs_open")

    def in_group(self, group_id: int) -> list[JobRow]:
        """Every job of one submission (arrays split past MaxArraySize are several)."""
        return self._rows.rows("group_id = ?", [group_id])

    def submitted_since(self, site: str, since: float) -> list[JobRow]:
        return self._rows.rows("site = ? AND submitted_at >= ?", [site, since], order_by="id")

    def of_site(self, site: str) -> list[JobRow]:
        return self._rows.rows("site = ?", [site], order_by="id")

    def of_sweep(self, sweep_id: str) -> list[JobRow]:
        return self._rows.rows("sweep_id = ?", [sweep_id])

    def session_dirs(self, job_ids: Collection[int]) -> dict[int, str]:
        """The job directories of the interactive sessions (`hpctrain notebook`) among ``job_ids``."""
        return self.dirs(job_ids, "AND json_extract(spec_json, '$.interactive') IS NOT NULL")

    def dirs(self, job_ids: Collection[int], where: str = "") -> dict[int, str]:
        """The job directories of ``job_ids`` (those that have one), of the jobs ``where`` (SQL) also says."""
        rows = self.ledger.db.query(
            f"SELECT id, job_dir FROM jobs WHERE id IN (SELECT value FROM json_each(?)) AND job_dir IS NOT NULL {where}",
            [ids_json(job_ids)],
        )
        return {r["id"]: r["job_dir"] for r in rows}

    def has_account(self, site: str, account: str) -> bool:
        return (
            self.ledger.db.execute(
                "SELECT 1 FROM jobs WHERE site = ? AND account = ? LIMIT 1", [site, account]
            ).fetchone()
            is not None
        )

    def undecided_deaths(self, site: str, states: Collection[str]) -> list[tuple[int, int]]:
        """(job id, task index; -1 for a plain job) of every plain job or array task in one of ``states`` whose last
        run nobody has decided on (requeue or not): from the runs not decided on (`attempts_undecided`), not from
        the whole history."""
        marks = _marks(states)
        return [
            (r["job_id"], r["task_index"])
            for r in self.ledger.db.query(
                # the undecided runs first (CROSS JOIN keeps that order): never the site's whole history
                "SELECT a.job_id, a.task_index FROM attempts a INDEXED BY attempts_undecided CROSS JOIN jobs j "
                "ON j.id = a.job_id "
                "LEFT JOIN array_tasks t ON t.job_id = a.job_id AND t.task_index = a.task_index "
                "WHERE a.requeued IS NULL AND j.site = ? AND a.attempt = (SELECT max(b.attempt) FROM attempts b "
                "WHERE b.job_id = a.job_id AND b.task_index = a.task_index) "
                f"AND CASE WHEN a.task_index < 0 THEN j.is_array = 0 AND j.state IN ({marks}) ELSE t.state IN ({marks}) END "
                "ORDER BY a.job_id, a.task_index",
                [site, *states, *states],
            )
        ]

    def waits_alike(
        self, site: str, partition: str, account: str, qos: str, gpus: int, since: float, limit: int = 50
    ) -> list[float]:
        """Seconds from submission to first start of the site's jobs submitted since ``since`` in ``partition``,
        ``account`` and ``qos`` whose first run held ``gpus`` GPUs (an array's: its task 0's), newest first, at
        most ``limit``: the history `hpctrain where` predicts from. Through the jobs' submission times only."""
        rows = self.ledger.db.execute(
            "SELECT a.started_at - j.submitted_at FROM jobs j INDEXED BY jobs_submitted JOIN attempts a "
            "ON a.job_id = j.id AND a.attempt = 0 AND a.task_index = CASE WHEN j.is_array THEN 0 ELSE -1 END "
            "WHERE j.site = ? AND j.submitted_at >= ? AND j.partition = ? AND j.account = ? AND j.qos = ? "
            "AND a.started_at IS NOT NULL AND a.alloc_gpus = ? ORDER BY j.submitted_at DESC LIMIT ?",
            [site, since, partition, account, qos, gpus, limit],
        )
        return [max(wait, 0.0) for (wait,) in rows]

    def racing(self, site: str) -> list[SubmittedJob]:
        """The site's submissions of a race (`submit --race`) still in it: not ended, not cancelled for it yet (an
        event `race_lost`)."""
        rows = self._rows.rows(
            "id IN (SELECT j.id FROM jobs j INDEXED BY jobs_open WHERE j.site = ? AND j.ended_at IS NULL "
            "AND j.race IS NOT NULL AND j.slurm_job_id IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM events e WHERE e.job_id = j.id AND e.kind = 'race_lost'))",
            [site],
        )
        return cast("list[SubmittedJob]", rows)

    def may_have_undecided_deaths(self, site: str) -> bool:
        """Whether a change since the last `no_undecided_deaths` of ``site`` may have left a run of it that died to
        decide (the triggers of every such change add its site to `sites_to_supervise`)."""
        found = self.ledger.db.execute("SELECT 1 FROM sites_to_supervise WHERE site = ?", [site]).fetchone()
        return found is not None

    def no_undecided_deaths(self, site: str, states: Collection[str]) -> bool:
        """Whether ``site`` has no `undecided_deaths` in ``states``; if so, it leaves `sites_to_supervise`, in the
        transaction that checked (a death recorded meanwhile waits for it, and marks the site again)."""
        with self.ledger.transaction() as db:
            if self.undecided_deaths(site, states):
                return False  # a requeue that failed (Slurm down): the next supervision tries it again
            db.execute("DELETE FROM sites_to_supervise WHERE site = ?", [site])
            return True

    def unsettled_tasks(self, job_id: int, final: Collection[str], died: Collection[str]) -> int:
        """How many of an array's tasks may still run: not in a ``final`` state, or ``died`` with their last
        attempt not yet decided on."""
        return self.ledger.db.execute(
            f"SELECT count(*) FROM array_tasks t WHERE t.job_id = ? AND (t.state NOT IN ({_marks(final)}) "
            f"OR (t.state IN ({_marks(died)}) AND (SELECT a.requeued FROM attempts a WHERE a.job_id = t.job_id "
            "AND a.task_index = t.task_index ORDER BY a.attempt DESC LIMIT 1) IS NULL))",
            [job_id, *final, *died],
        ).fetchone()[0]

    def tasks(self, job_id: int) -> list[ArrayTaskRow]:
        return self._tasks.rows("job_id = ?", [job_id], order_by="task_index")

    def task_states(self, job_id: int) -> dict[int, str]:
        return {r["task_index"]: r["state"] for r in self.tasks(job_id)}

    def set_task_state(self, job_id: int, task_index: int, state: str, restarts: int | None = None) -> None:
        """An array task's state (and its restart count, which only grows)."""
        with self.ledger.transaction() as db:
            db.execute(
                "UPDATE array_tasks SET state = ?, restarts = max(restarts, coalesce(?, restarts)), "
                "updated_at = ? WHERE job_id = ? AND task_index = ?",
                [state, restarts, time.time(), job_id, task_index],
            )
