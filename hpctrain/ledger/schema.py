"""Versioned ledger schema: migration N brings a database from user_version N-1 to N.

Append new migrations; never edit one that has shipped.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not at run time: the batch script reads INTERRUPTED without loading SQLite's stack
    import sqlite3
    from collections.abc import Callable
    from typing import TypeAlias

    # A migration's step: an SQL statement, or a function that runs its statements on the connection.
    Step: TypeAlias = str | Callable[[sqlite3.Connection], None]

# Whether a job's spec says `[eval] on_checkpoint` (a spec that is not JSON says no): `jobs_eval_on_checkpoint`
# indexes those jobs, for queries that carry this very expression.
EVAL_ON_CHECKPOINT = "CASE WHEN json_valid(spec_json) THEN json_extract(spec_json, '$.eval.on_checkpoint') END"

# A settled job's runs (run_usage) summed into its job_usage row, for the jobs that the query {jobs} names. A job
# whose runs differ in account, partition or whether they journal steps is not ``uniform``: it is read run by run.
_V16_CAUSES = (
    "productive",
    "recomputed",
    "startup",
    "overhead",
    "hang",
    "crash",
    "stop",
    "end",
    "rerun",
    "other",
    "spare",
)


def job_usage_from_runs(causes: tuple[str, ...]) -> str:
    """The statement that sums a settled job's runs into job_usage, with a column per cause in ``causes``."""
    return f"""INSERT OR REPLACE INTO job_usage (job_id, site, account, partition, user, sweep_id, measured,
    uniform, runs, started_at, ended_at, lost_from, gpu_hours, lost_gpu_hours, queue_s,
    {", ".join(f"{c}_h" for c in causes)})
SELECT u.job_id, min(u.site), min(u.account), min(u.partition), j.user, j.sweep_id, max(u.measured),
       count(DISTINCT coalesce(u.account, '')) = 1 AND count(DISTINCT coalesce(u.partition, '')) = 1
           AND min(u.measured) = max(u.measured),
       count(*), min(u.started_at), max(u.ended_at), min(u.lost_from), sum(u.gpu_hours),
       sum(CASE WHEN u.lost_from IS NULL THEN 0.0 ELSE u.gpus * max(0.0, u.ended_at - u.lost_from) / 3600 END),
       sum(u.queue_s), {", ".join(f"sum(u.{c}_h)" for c in causes)}
FROM run_usage u JOIN jobs j ON j.id = u.job_id WHERE u.job_id IN ({{jobs}}) GROUP BY u.job_id"""


# The causes GPU-hours are kept by today, a column <cause>_h each (migration 17 added interactive sessions'):
# hpctrain.jobs.goodput splits a run's time by them.
CAUSES = (*_V16_CAUSES[:-2], "interactive", *_V16_CAUSES[-2:])
JOB_USAGE_FROM_RUNS = job_usage_from_runs(CAUSES)
# Ends of a run that lose the work since its newest checkpoint, as journaled (an announced preemption and a time
# limit do not: their notice saves a stop checkpoint; "requeued": a run ended without a word, killed with no notice),
# and the sacct states of runs that journaled none (no notice seen). Here, not in ledger.attempts, so that the batch
# script's `hpctrain attempt` calls read them without loading SQLite's stack.
LOSES_WORK = ("node_failure", "requeued", "error", "oom", "hang", "failed")
LOSES_WORK_STATES = ("PREEMPTED", "NODE_FAIL", "FAILED", "OUT_OF_MEMORY")


def _minute(x: str) -> str:
    """ceil(x / 60) in SQL: the minute whose end closes the span ((minute - 1) * 60, minute * 60] holding x."""
    return f"(CAST({x} / 60 AS INTEGER) + ({x} / 60 > CAST({x} / 60 AS INTEGER)))"


def _rate(run: str) -> str:
    """A kept run's GPU-hours per second of its run time."""
    return f"(CASE WHEN {run}.ended_at > {run}.started_at THEN {run}.gpu_hours / ({run}.ended_at - {run}.started_at) ELSE 0.0 END)"


def _minutes_change(run: str, sign: str) -> list[str]:
    """Statements adding (sign '+') or taking away ('-') a run's rate at the minutes of its start and end."""
    rate, start, end = _rate(run), _minute(f"{run}.started_at"), _minute(f"{run}.ended_at")
    return [
        f"""INSERT INTO usage_minutes (site, minute, account, started_rate, started_rate_off)
        VALUES ({run}.site, {start}, coalesce({run}.account, ''), {sign}{rate}, {sign}{rate} * ({run}.started_at - 60 * {start}))
        ON CONFLICT DO UPDATE SET started_rate = started_rate + excluded.started_rate,
            started_rate_off = started_rate_off + excluded.started_rate_off;""",
        f"""INSERT INTO usage_minutes (site, minute, account, ended_rate, ended_rate_off, ended_hours)
        VALUES ({run}.site, {end}, coalesce({run}.account, ''), {sign}{rate}, {sign}{rate} * ({run}.started_at - 60 * {end}),
            {sign}{run}.gpu_hours)
        ON CONFLICT DO UPDATE SET ended_rate = ended_rate + excluded.ended_rate,
            ended_rate_off = ended_rate_off + excluded.ended_rate_off, ended_hours = ended_hours + excluded.ended_hours;""",
    ]


def _minutes_from_runs() -> list[str]:
    """The kept runs' rates summed into usage_minutes (a ledger's run_usage before usage_minutes was made)."""
    rate, start, end = _rate("u"), _minute("u.started_at"), _minute("u.ended_at")
    return [
        f"""INSERT INTO usage_minutes (site, minute, account, started_rate, started_rate_off)
        SELECT site, m, a, sum(r), sum(r * (started_at - 60 * m)) FROM (
            SELECT u.site, {start} AS m, coalesce(u.account, '') AS a, {rate} AS r, u.started_at FROM run_usage u)
        GROUP BY 1, 2, 3""",
        f"""INSERT INTO usage_minutes (site, minute, account, ended_rate, ended_rate_off, ended_hours)
        SELECT site, m, a, sum(r), sum(r * (started_at - 60 * m)), sum(gpu_hours) FROM (
            SELECT u.site, {end} AS m, coalesce(u.account, '') AS a, {rate} AS r, u.started_at, u.gpu_hours
            FROM run_usage u)
        WHERE true GROUP BY 1, 2, 3
        ON CONFLICT DO UPDATE SET ended_rate = excluded.ended_rate, ended_rate_off = excluded.ended_rate_off,
            ended_hours = excluded.ended_hours""",
    ]


def _ids_never_reused(table: str) -> Callable[[sqlite3.Connection], None]:
    """The step that makes ``table``'s ``id INTEGER PRIMARY KEY`` AUTOINCREMENT. Without it SQLite gives the highest
    ids again once their rows are deleted, and `ledger archive` moves rows out: a new row then took the id of one
    in the archive. SQLite cannot alter a key, so the table is rebuilt from its definition as it stands (with the
    columns earlier migrations added), its indexes and triggers made again; the copy seeds sqlite_sequence with the
    highest id. Foreign keys are off while a ledger migrates, and legacy_alter_table keeps the rename from checking
    or rewriting the triggers and tables that name ``table`` while it is away."""

    def step(conn: sqlite3.Connection) -> None:
        (create,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [table]).fetchone()
        if re.search(r"\bAUTOINCREMENT\b", create, re.IGNORECASE):
            return  # already (a ledger taken back to an older version by hand, as a test of upgrades does)
        attached = [
            sql
            for (sql,) in conn.execute(
                "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND type IN ('index', 'trigger') AND sql IS NOT NULL",
                [table],
            )
        ]
        new, n = re.subn(
            rf'^CREATE TABLE "?{table}"?(.*?)\bid INTEGER PRIMARY KEY\b',
            rf"CREATE TABLE _new_{table}\1id INTEGER PRIMARY KEY AUTOINCREMENT",
            create,
            flags=re.S,
        )
        assert n == 1, create
        conn.execute(new)
        conn.execute(f"INSERT INTO _new_{table} SELECT * FROM {table}")
        conn.execute(f"DROP TABLE {table}")
        conn.execute("PRAGMA legacy_alter_table = ON")
        try:
            conn.execute(f"ALTER TABLE _new_{table} RENAME TO {table}")
        finally:
            conn.execute("PRAGMA legacy_alter_table = OFF")
        for sql in attached:
            conn.execute(sql)

    return step


_TAIL_UPSERT = """INSERT INTO metric_tails VALUES (NEW.job_id, NEW.task_index, NEW.time, NEW.step)
    ON CONFLICT (job_id, task_index) DO UPDATE SET
    last_at = max(coalesce(last_at, excluded.last_at), coalesce(excluded.last_at, last_at)),
    last_step = max(last_step, excluded.last_step)"""


def _site_marks(table: str, suffix: str) -> list[Step]:
    """``table`` (site TEXT PRIMARY KEY) and the triggers that add a job's site to it on every change that can leave
    a run of it to decide: a run added or undecided again, a job's or array task's state changed, a task added."""
    mark = f"INSERT OR IGNORE INTO {table} SELECT site FROM jobs WHERE id = NEW.job_id AND site IS NOT NULL"
    return [
        f"CREATE TABLE {table} (site TEXT PRIMARY KEY) WITHOUT ROWID",
        f"INSERT INTO {table} SELECT DISTINCT site FROM jobs WHERE site IS NOT NULL",
        f"CREATE TRIGGER attempts_new_{suffix} AFTER INSERT ON attempts BEGIN {mark}; END",
        f"""CREATE TRIGGER attempts_undecided_{suffix} AFTER UPDATE OF requeued ON attempts
            WHEN NEW.requeued IS NULL AND OLD.requeued IS NOT NULL BEGIN {mark}; END""",
        f"""CREATE TRIGGER jobs_state_{suffix} AFTER UPDATE OF state ON jobs
            WHEN NEW.state IS NOT OLD.state AND NEW.site IS NOT NULL BEGIN
            INSERT OR IGNORE INTO {table} VALUES (NEW.site); END""",
        f"CREATE TRIGGER tasks_new_{suffix} AFTER INSERT ON array_tasks BEGIN {mark}; END",
        f"""CREATE TRIGGER tasks_state_{suffix} AFTER UPDATE OF state ON array_tasks
            WHEN NEW.state IS NOT OLD.state BEGIN {mark}; END""",
    ]


MIGRATIONS: list[list[Step]] = [
    # 1: the core tables.
    [
        """CREATE TABLE jobs (
            id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            site TEXT NOT NULL,
            user TEXT,
            account TEXT,
            partition TEXT,
            qos TEXT,
            slurm_job_id TEXT,
            is_array INTEGER NOT NULL DEFAULT 0,
            state TEXT NOT NULL DEFAULT 'NEW',
            submitted_at REAL,
            started_at REAL,
            ended_at REAL,
            spec_json TEXT,
            script_sha256 TEXT,
            script_path TEXT,
            choice_reason TEXT,
            sweep_id TEXT REFERENCES sweeps(id),
            lineage_json TEXT,
            updated_at REAL
        )""",
        "CREATE UNIQUE INDEX jobs_slurm_id ON jobs(site, slurm_job_id) WHERE slurm_job_id IS NOT NULL",
        "CREATE INDEX jobs_state ON jobs(state)",
        """CREATE TABLE array_tasks (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL,
            param_index INTEGER NOT NULL,
            params_json TEXT,
            state TEXT NOT NULL DEFAULT 'PENDING',
            restarts INTEGER NOT NULL DEFAULT 0,
            updated_at REAL,
            PRIMARY KEY (job_id, task_index)
        )""",
        """CREATE TABLE attempts (
            id INTEGER PRIMARY KEY,
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL DEFAULT -1,
            attempt INTEGER NOT NULL,
            slurm_job_id TEXT,
            state TEXT,
            node_list TEXT,
            started_at REAL,
            ended_at REAL,
            exit_code TEXT,
            alloc_gpus INTEGER,
            reason TEXT,
            UNIQUE (job_id, task_index, attempt)
        )""",
        """CREATE TABLE checkpoints (
            id INTEGER PRIMARY KEY,
            job_id INTEGER REFERENCES jobs(id),
            task_index INTEGER NOT NULL DEFAULT -1,
            step INTEGER NOT NULL,
            path TEXT NOT NULL UNIQUE,
            state TEXT NOT NULL,
            created_at REAL NOT NULL,
            bytes INTEGER,
            duration_s REAL,
            manifest_sha256 TEXT,
            metric_name TEXT,
            metric_value REAL,
            note TEXT
        )""",
        """CREATE TABLE metrics (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL DEFAULT -1,
            name TEXT NOT NULL,
            step INTEGER NOT NULL,
            value REAL,
            attempt INTEGER,
            time REAL,
            PRIMARY KEY (job_id, task_index, name, step)
        )""",
        """CREATE TABLE sweeps (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            method TEXT NOT NULL,
            state TEXT NOT NULL DEFAULT 'ACTIVE',
            spec_json TEXT,
            created_at REAL NOT NULL,
            updated_at REAL
        )""",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL,
            kind TEXT NOT NULL,
            job_id INTEGER,
            message TEXT,
            data_json TEXT
        )""",
        "CREATE INDEX events_job ON events(job_id, time)",
    ],
    # 2: journal records (written by compute nodes) already folded in, so ingest is idempotent.
    [
        """CREATE TABLE journal_ingested (
            journal TEXT NOT NULL,
            name TEXT NOT NULL,
            kind TEXT NOT NULL,
            ingested_at REAL NOT NULL,
            PRIMARY KEY (journal, name)
        )""",
    ],
    # 3: submission groups (array chunks), job directories, cached cluster limits.
    [
        "ALTER TABLE jobs ADD COLUMN group_id INTEGER REFERENCES jobs(id)",
        "ALTER TABLE jobs ADD COLUMN job_dir TEXT",
        "ALTER TABLE jobs ADD COLUMN param_offset INTEGER",
        "ALTER TABLE jobs ADD COLUMN error TEXT",
        "CREATE INDEX jobs_group ON jobs(group_id)",
        """CREATE TABLE site_cache (
            site TEXT NOT NULL,
            key TEXT NOT NULL,
            value_json TEXT,
            fetched_at REAL NOT NULL,
            PRIMARY KEY (site, key)
        )""",
    ],
    # 4: what each attempt achieved, whether it was requeued and why (or why the job stopped there);
    # attempt numbers continued across resubmissions under a new Slurm id.
    [
        "ALTER TABLE attempts ADD COLUMN cause TEXT",
        "ALTER TABLE attempts ADD COLUMN step_start INTEGER",
        "ALTER TABLE attempts ADD COLUMN step_end INTEGER",
        "ALTER TABLE attempts ADD COLUMN requeued INTEGER",
        "ALTER TABLE attempts ADD COLUMN decision TEXT",
        "ALTER TABLE jobs ADD COLUMN attempt_base INTEGER NOT NULL DEFAULT 0",
    ],
    # 5: sweep trials, each linked to the array task that runs it.
    [
        """CREATE TABLE trials (
            sweep_id TEXT NOT NULL REFERENCES sweeps(id),
            number INTEGER NOT NULL,
            params_json TEXT NOT NULL,
            state TEXT NOT NULL,
            job_id INTEGER REFERENCES jobs(id),
            task_index INTEGER,
            failures INTEGER NOT NULL DEFAULT 0,
            value REAL,
            reason TEXT,
            updated_at REAL,
            PRIMARY KEY (sweep_id, number)
        )""",
        "CREATE INDEX trials_state ON trials(sweep_id, state)",
        "CREATE INDEX trials_job ON trials(job_id, task_index)",
    ],
    # 6: each attempt's elapsed seconds as Slurm accounts them (sacct ElapsedRaw), for GPU-hours.
    [
        "ALTER TABLE attempts ADD COLUMN elapsed_s INTEGER",
        "CREATE INDEX attempts_started ON attempts(started_at)",
    ],
    # 7: each start of a job step within a run (in-allocation restarts), for goodput by cause.
    [
        """CREATE TABLE segments (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL DEFAULT -1,
            attempt INTEGER NOT NULL,
            step_restart INTEGER NOT NULL DEFAULT 0,
            main_at REAL,
            loaded_at REAL,
            resumed_from INTEGER,
            tier TEXT,
            steps INTEGER NOT NULL DEFAULT 0,
            step_seconds REAL NOT NULL DEFAULT 0,
            last_step INTEGER,
            last_step_at REAL,
            hung INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (job_id, task_index, attempt, step_restart)
        )""",
    ],
    # 8: each attempt's GPU-seconds as sacct counts them (a run whose allocation shrank is listed in parts), and
    # those of its spare nodes' GPUs while they waited.
    [
        "ALTER TABLE attempts ADD COLUMN gpu_s REAL",
        "ALTER TABLE attempts ADD COLUMN idle_gpu_s REAL",
    ],
    # 9: queries that stay as fast after years of jobs: jobs not ended (partial) or ended since a time, runs not
    # decided on (partial) or ended since a time, a job's checkpoints, active sweeps (partial).
    [
        "CREATE INDEX jobs_open ON jobs(site, state) WHERE ended_at IS NULL",
        "CREATE INDEX jobs_ended ON jobs(site, ended_at)",
        "CREATE INDEX attempts_undecided ON attempts(job_id, task_index, attempt) WHERE requeued IS NULL",
        "CREATE INDEX checkpoints_job ON checkpoints(job_id, task_index, created_at)",
        "CREATE INDEX attempts_ended ON attempts(ended_at)",
        "CREATE INDEX sweeps_active ON sweeps(created_at) WHERE state = 'ACTIVE'",
    ],
    # 10: when a job's journal was last read: an ended job's journal is read no more once a read came a while
    # after its end (hpctrain.ledger.jobs.JOURNAL_SETTLE_S, spelled out in the partial index).
    [
        "ALTER TABLE jobs ADD COLUMN journal_read_at REAL",
        "CREATE INDEX jobs_journal_unsettled ON jobs(site, ended_at) "
        "WHERE journal_read_at IS NULL OR journal_read_at < ended_at + 60",
    ],
    # 11: each run's GPU-hours by goodput cause, kept once its job has settled (hpctrain.jobs.accounting.settle) so
    # that cost and reports over months sum rows; a job whose end changes (requeued, resubmitted) loses them until
    # it settles again. A sweep's jobs by index.
    [
        "ALTER TABLE jobs ADD COLUMN usage_settled_at REAL",
        "CREATE INDEX jobs_usage_unsettled ON jobs(site, ended_at) WHERE usage_settled_at IS NULL",
        "CREATE INDEX jobs_sweep ON jobs(sweep_id) WHERE sweep_id IS NOT NULL",
        """CREATE TABLE run_usage (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            site TEXT NOT NULL,
            account TEXT,
            partition TEXT,
            gpus INTEGER NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL NOT NULL,
            cause TEXT,
            gpu_hours REAL NOT NULL,
            lost_from REAL,
            measured INTEGER NOT NULL,
            queue_s REAL NOT NULL,
            productive_h REAL NOT NULL,
            recomputed_h REAL NOT NULL,
            startup_h REAL NOT NULL,
            overhead_h REAL NOT NULL,
            hang_h REAL NOT NULL,
            crash_h REAL NOT NULL,
            stop_h REAL NOT NULL,
            end_h REAL NOT NULL,
            other_h REAL NOT NULL,
            spare_h REAL NOT NULL,
            PRIMARY KEY (job_id, task_index, attempt)
        )""",
        "CREATE INDEX run_usage_ended ON run_usage(site, ended_at)",
        """CREATE TRIGGER run_usage_reopened AFTER UPDATE OF ended_at ON jobs
            WHEN NEW.ended_at IS NOT OLD.ended_at AND OLD.usage_settled_at IS NOT NULL
        BEGIN
            DELETE FROM run_usage WHERE job_id = NEW.id;
            UPDATE jobs SET usage_settled_at = NULL WHERE id = NEW.id;
        END""",
    ],
    # 12: evaluations of checkpoints: one per (job, task, step, evaluator), asked for once, done by a job of its own.
    [
        """CREATE TABLE evaluations (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL DEFAULT -1,
            step INTEGER NOT NULL,
            evaluator TEXT NOT NULL,
            checkpoint TEXT NOT NULL,
            eval_job_id INTEGER REFERENCES jobs(id),
            state TEXT NOT NULL,
            metrics_json TEXT,
            error TEXT,
            requested_at REAL NOT NULL,
            done_at REAL,
            PRIMARY KEY (job_id, task_index, step, evaluator)
        )""",
        "CREATE INDEX evaluations_eval_job ON evaluations(eval_job_id)",
    ],
    # 13: the model registry. A version is immutable (triggers refuse changing or deleting one); an alias points at
    # one version of its model and is moved, never copied; every move is kept, with the gate's numbers.
    [
        """CREATE TABLE registered_models (
            name TEXT PRIMARY KEY,
            gate_evaluator TEXT NOT NULL,
            gate_metric TEXT NOT NULL,
            gate_mode TEXT NOT NULL CHECK (gate_mode IN ('min', 'max')),
            gate_threshold REAL,
            created_at REAL NOT NULL,
            created_by TEXT NOT NULL
        )""",
        """CREATE TABLE model_versions (
            model TEXT NOT NULL REFERENCES registered_models(name),
            version INTEGER NOT NULL CHECK (version >= 1),
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL,
            step INTEGER NOT NULL,
            checkpoint TEXT NOT NULL,
            manifest_sha256 TEXT NOT NULL,
            lineage_json TEXT NOT NULL,
            registered_at REAL NOT NULL,
            registered_by TEXT NOT NULL,
            PRIMARY KEY (model, version)
        )""",
        "CREATE INDEX model_versions_checkpoint ON model_versions(job_id, task_index, step)",
        """CREATE TRIGGER model_versions_immutable BEFORE UPDATE ON model_versions
        BEGIN SELECT RAISE(ABORT, 'a model version is immutable'); END""",
        """CREATE TRIGGER model_versions_kept BEFORE DELETE ON model_versions
        BEGIN SELECT RAISE(ABORT, 'a model version is immutable'); END""",
        """CREATE TABLE model_aliases (
            model TEXT NOT NULL,
            alias TEXT NOT NULL,
            version INTEGER NOT NULL,
            moved_at REAL NOT NULL,
            PRIMARY KEY (model, alias),
            FOREIGN KEY (model, version) REFERENCES model_versions(model, version)
        )""",
        """CREATE TABLE alias_moves (
            id INTEGER PRIMARY KEY,
            model TEXT NOT NULL REFERENCES registered_models(name),
            alias TEXT NOT NULL,
            action TEXT NOT NULL CHECK (action IN ('promote', 'force', 'rollback')),
            from_version INTEGER,
            to_version INTEGER,
            undoes INTEGER REFERENCES alias_moves(id),
            at REAL NOT NULL,
            by TEXT NOT NULL,
            why TEXT,
            gate_json TEXT
        )""",
        "CREATE INDEX alias_moves_alias ON alias_moves(model, alias, id)",
    ],
    # 14: what each tracker (MLflow at one URI, ...) has of each job's task: its run there, the metrics up to a rowid
    # and the evaluations up to a time, so that a later export sends only what is new.
    [
        """CREATE TABLE tracker_exports (
            tracker TEXT NOT NULL,
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL,
            run_id TEXT NOT NULL,
            metrics_rowid INTEGER NOT NULL DEFAULT 0,
            evaluations_at REAL NOT NULL DEFAULT 0,
            state TEXT,
            exported_at REAL NOT NULL,
            PRIMARY KEY (tracker, job_id, task_index)
        )""",
        "CREATE INDEX jobs_submitted ON jobs(site, submitted_at)",
    ],
    # 15: what sacct last said of each active job (a digest of its rows): a poll folds in only the jobs whose rows
    # changed. Whatever else changes what a poll would make of them (a run decided, a state set by hpctrain)
    # forgets the digest.
    [
        "ALTER TABLE jobs ADD COLUMN sacct_digest TEXT",
        """CREATE TRIGGER attempts_new_forget_digest AFTER INSERT ON attempts BEGIN
            UPDATE jobs SET sacct_digest = NULL WHERE id = NEW.job_id AND sacct_digest IS NOT NULL; END""",
        """CREATE TRIGGER attempts_decided_forget_digest AFTER UPDATE OF requeued ON attempts
            WHEN NEW.requeued IS NOT OLD.requeued BEGIN
            UPDATE jobs SET sacct_digest = NULL WHERE id = NEW.job_id AND sacct_digest IS NOT NULL; END""",
        """CREATE TRIGGER jobs_state_forget_digest AFTER UPDATE OF state, attempt_base, slurm_job_id ON jobs
            WHEN NEW.sacct_digest IS NOT NULL BEGIN UPDATE jobs SET sacct_digest = NULL WHERE id = NEW.id; END""",
        """CREATE TRIGGER tasks_state_forget_digest AFTER UPDATE OF state ON array_tasks
            WHEN NEW.state IS NOT OLD.state BEGIN
            UPDATE jobs SET sacct_digest = NULL WHERE id = NEW.job_id AND sacct_digest IS NOT NULL; END""",
    ],
    # 16: each settled job's runs summed (job_usage): a window's jobs that ran wholly inside it are read as one row
    # each, not a row per run. Reopening a job drops its sums with its runs. A cause of lost GPU time: runs Slurm
    # started on its own after the job's work was done (rerun).
    [
        "ALTER TABLE run_usage ADD COLUMN rerun_h REAL NOT NULL DEFAULT 0.0",
        f"""CREATE TABLE job_usage (
            job_id INTEGER PRIMARY KEY REFERENCES jobs(id),
            site TEXT NOT NULL,
            account TEXT,
            partition TEXT,
            user TEXT,
            sweep_id TEXT,
            measured INTEGER NOT NULL,
            uniform INTEGER NOT NULL,
            runs INTEGER NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL NOT NULL,
            lost_from REAL,
            gpu_hours REAL NOT NULL,
            lost_gpu_hours REAL NOT NULL,
            queue_s REAL NOT NULL,
            {", ".join(f"{c}_h REAL NOT NULL" for c in _V16_CAUSES)}
        )""",
        "CREATE INDEX job_usage_ended ON job_usage(site, ended_at, started_at)",
        "DROP TRIGGER run_usage_reopened",
        """CREATE TRIGGER run_usage_reopened AFTER UPDATE OF ended_at ON jobs
            WHEN NEW.ended_at IS NOT OLD.ended_at AND OLD.usage_settled_at IS NOT NULL
        BEGIN
            DELETE FROM run_usage WHERE job_id = NEW.id;
            DELETE FROM job_usage WHERE job_id = NEW.id;
            UPDATE jobs SET usage_settled_at = NULL WHERE id = NEW.id;
        END""",
        job_usage_from_runs(_V16_CAUSES).format(jobs="SELECT DISTINCT job_id FROM run_usage"),
        # Each minute's kept runs that started or ended in it, their rates (GPU-hours per second) and rate x
        # (start - the minute's end): a report's running totals at whole minutes sum minutes, not runs.
        """CREATE TABLE usage_minutes (
            site TEXT NOT NULL,
            minute INTEGER NOT NULL,
            account TEXT NOT NULL,
            started_rate REAL NOT NULL DEFAULT 0.0,
            started_rate_off REAL NOT NULL DEFAULT 0.0,
            ended_rate REAL NOT NULL DEFAULT 0.0,
            ended_rate_off REAL NOT NULL DEFAULT 0.0,
            ended_hours REAL NOT NULL DEFAULT 0.0,
            PRIMARY KEY (site, minute, account)
        ) WITHOUT ROWID""",
        *_minutes_from_runs(),
        f"CREATE TRIGGER usage_minutes_kept AFTER INSERT ON run_usage BEGIN {' '.join(_minutes_change('NEW', '+'))} END",
        f"CREATE TRIGGER usage_minutes_dropped AFTER DELETE ON run_usage BEGIN {' '.join(_minutes_change('OLD', '-'))} END",
    ],
    # 17: GPU time of interactive sessions (`hpctrain notebook`), a cause of its own.
    [
        "ALTER TABLE run_usage ADD COLUMN interactive_h REAL NOT NULL DEFAULT 0.0",
        "ALTER TABLE job_usage ADD COLUMN interactive_h REAL NOT NULL DEFAULT 0.0",
    ],
    # 18: a checkpoint is one version of a model: two registrations of it at once made two. A trigger, not a UNIQUE
    # index: a ledger may hold such twins already, and versions are never deleted.
    [
        """CREATE TRIGGER model_versions_once BEFORE INSERT ON model_versions
            WHEN EXISTS (SELECT 1 FROM model_versions WHERE model = NEW.model AND job_id = NEW.job_id
                         AND task_index = NEW.task_index AND step = NEW.step)
        BEGIN SELECT RAISE(ABORT, 'this checkpoint is a version of this model already'); END""",
    ],
    # 19: an evaluation's lifecycle: requested (committed before its sbatch, with the Slurm job name it is
    # submitted under, to find it again) -> submitted -> done | failed | expired. A request with its job is
    # submitted; failed and expired ones may be asked again.
    [
        "ALTER TABLE evaluations ADD COLUMN submission_key TEXT",
        "UPDATE evaluations SET state = 'submitted' WHERE state = 'requested' AND eval_job_id IS NOT NULL",
        "CREATE INDEX evaluations_state ON evaluations(state)",
    ],
    # 20: ids given once. `ledger archive` moves the rows holding a table's highest ids out, and the ledger gave
    # them again: the next archive into the same file took the new rows for ones it held.
    [_ids_never_reused(table) for table in ("jobs", "attempts", "checkpoints", "events")],
    # 21: the order values reach the ledger: `seq`, from one counter (ledger_info), set on every metric value and
    # evaluation result written or changed (a recomputed step, an evaluation reported again), so that an export
    # resumes after the last one a tracker holds, whatever the clocks said; and the ledger's own id, which keys the
    # runs it sends to a tracker. What a tracker was sent is counted in seq (tracker_exports.sent_seq).
    [
        """CREATE TABLE ledger_info (
            one INTEGER PRIMARY KEY CHECK (one = 1),
            id TEXT NOT NULL,
            seq INTEGER NOT NULL
        )""",
        "ALTER TABLE metrics ADD COLUMN seq INTEGER",
        "ALTER TABLE evaluations ADD COLUMN seq INTEGER",
        "UPDATE metrics SET seq = rowid",
        "UPDATE evaluations SET seq = (SELECT coalesce(max(rowid), 0) FROM metrics) + rowid",
        """INSERT INTO ledger_info VALUES (1, lower(hex(randomblob(16))),
            (SELECT coalesce(max(rowid), 0) FROM metrics) + (SELECT coalesce(max(rowid), 0) FROM evaluations))""",
        "CREATE INDEX metrics_seq ON metrics(job_id, task_index, seq)",
        """CREATE TRIGGER metrics_seq_new AFTER INSERT ON metrics BEGIN
            UPDATE ledger_info SET seq = seq + 1;
            UPDATE metrics SET seq = (SELECT seq FROM ledger_info) WHERE rowid = NEW.rowid; END""",
        """CREATE TRIGGER metrics_seq_changed AFTER UPDATE OF value ON metrics WHEN NEW.value IS NOT OLD.value BEGIN
            UPDATE ledger_info SET seq = seq + 1;
            UPDATE metrics SET seq = (SELECT seq FROM ledger_info) WHERE rowid = NEW.rowid; END""",
        """CREATE TRIGGER evaluations_seq_new AFTER INSERT ON evaluations BEGIN
            UPDATE ledger_info SET seq = seq + 1;
            UPDATE evaluations SET seq = (SELECT seq FROM ledger_info) WHERE rowid = NEW.rowid; END""",
        """CREATE TRIGGER evaluations_seq_changed AFTER UPDATE OF state, metrics_json ON evaluations
            WHEN NEW.state IS NOT OLD.state OR NEW.metrics_json IS NOT OLD.metrics_json BEGIN
            UPDATE ledger_info SET seq = seq + 1;
            UPDATE evaluations SET seq = (SELECT seq FROM ledger_info) WHERE rowid = NEW.rowid; END""",
        "ALTER TABLE tracker_exports RENAME COLUMN metrics_rowid TO sent_seq",
        "ALTER TABLE tracker_exports DROP COLUMN evaluations_at",
    ],
    # 22: the jobs whose spec says `[eval] on_checkpoint`, that reconcile follows: found by this index, not by
    # parsing the spec of every job that ended lately.
    [f"CREATE INDEX jobs_eval_on_checkpoint ON jobs(site, ended_at) WHERE {EVAL_ON_CHECKPOINT}"],
    # 23: each task's newest metric (when, and the highest step), kept as values arrive: status's alerts read it
    # instead of a running job's whole history (max(time) over 500 k points of one job took 0.19 s a job). Each
    # journal directory's mtime when it was last read through: a refresh lists only those that changed since.
    [
        "CREATE TABLE journal_seen (journal TEXT PRIMARY KEY, mtime_ns INTEGER NOT NULL)",
        """CREATE TABLE metric_tails (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL,
            last_at REAL,
            last_step INTEGER,
            PRIMARY KEY (job_id, task_index)
        )""",
        "INSERT INTO metric_tails SELECT job_id, task_index, max(time), max(step) FROM metrics GROUP BY 1, 2",
        f"""CREATE TRIGGER metric_tails_new AFTER INSERT ON metrics BEGIN {_TAIL_UPSERT}; END""",
        f"""CREATE TRIGGER metric_tails_changed AFTER UPDATE OF time ON metrics BEGIN {_TAIL_UPSERT}; END""",
    ],
    # 24: how busy each GPU was (issue 61), from the nodes' samplers (hpctrain.runtime.utilization): per job step
    # start and GPU its summary so far (the newest record's) and the policy it was counted by, and a timeline: a row a
    # node and minute, each GPU's mean percent and peak MiB in it as JSON objects by GPU (a row a GPU and minute took
    # 5.5 kB a GPU-hour), by job and time (status reads each running job's last minutes).
    [
        """CREATE TABLE gpu_use (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            step_restart INTEGER NOT NULL,
            node TEXT NOT NULL,
            device TEXT NOT NULL,
            kind TEXT NOT NULL,
            samples INTEGER NOT NULL,
            seconds REAL NOT NULL,
            mean REAL,
            p10 REAL,
            mem_peak REAL,
            mem_total REAL,
            energy_j REAL,
            idle_s REAL NOT NULL,
            idle_now_s REAL NOT NULL,
            below_percent REAL NOT NULL,
            after_s REAL NOT NULL,
            alert_s REAL NOT NULL,
            at REAL NOT NULL,
            final INTEGER NOT NULL,
            PRIMARY KEY (job_id, task_index, attempt, step_restart, node, device)
        )""",
        """CREATE TABLE gpu_timeline (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            at REAL NOT NULL,
            task_index INTEGER NOT NULL,
            node TEXT NOT NULL,
            util TEXT NOT NULL,
            mem TEXT NOT NULL,
            PRIMARY KEY (job_id, at, task_index, node)
        ) WITHOUT ROWID""",
    ],
    # 25: the sites where a run may be left undecided (`Attempts.decide_left_over`): a site is added by every change
    # that can leave one there (a run added or undecided again, a job's or task's state changed), and removed once
    # none is left in it. A poll with nothing new then reads one row instead of checking each live run (0.1 s of
    # `status` on 2,000 active jobs).
    _site_marks("sites_to_decide", "to_decide"),
    # 26: the same for the runs that died without a decision (`Jobs.undecided_deaths`), which supervision (the tick,
    # reconcile) decides: a site leaves it once none is left, and a supervision with nothing new reads that row
    # instead of every live run (0.03 s of each tick on 2,000 active jobs).
    _site_marks("sites_to_supervise", "to_supervise"),
    # 27: the submissions of one job to several placements, one group, of which the first to claim the race file
    # named here runs (`submit --race`); the polls cancel the others.
    ["ALTER TABLE jobs ADD COLUMN race TEXT"],
    # 28: a settled job's GPU use packed (issue 61: a heavy year's summaries were 8.5 GiB, its timelines 220 GiB):
    # `gpu_runs` a row a job step start and node, its GPUs' figures one binary record each (hpctrain.ledger.gpus),
    # their idle seconds summed for `cost`; `gpu_curves` a row a task and node, its timeline's points packed, kept
    # for a window of days by `at` (with a rowid: a row of 1.7 kB fits in a page of a table's B-tree, where an
    # index's, a table WITHOUT ROWID's, spills over 1 kB into a page of its own). A job reopened loses both: its
    # journal's records, read again (its directory's mtime forgotten: read even if nothing was written since),
    # rebuild them.
    [
        """CREATE TABLE gpu_runs (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            step_restart INTEGER NOT NULL,
            node TEXT NOT NULL,
            kind TEXT NOT NULL,
            samples INTEGER NOT NULL,
            at REAL NOT NULL,
            below_percent REAL NOT NULL,
            after_s REAL NOT NULL,
            alert_s REAL NOT NULL,
            idle_s REAL NOT NULL,
            devices TEXT NOT NULL,
            gpus BLOB NOT NULL,
            PRIMARY KEY (job_id, task_index, attempt, step_restart, node)
        ) WITHOUT ROWID""",
        """CREATE TABLE gpu_curves (
            job_id INTEGER NOT NULL REFERENCES jobs(id),
            task_index INTEGER NOT NULL,
            node TEXT NOT NULL,
            at REAL NOT NULL,
            devices TEXT NOT NULL,
            points BLOB NOT NULL,
            PRIMARY KEY (job_id, task_index, node)
        )""",
        "CREATE INDEX gpu_curves_at ON gpu_curves(at)",
        """CREATE TRIGGER gpu_packed_reopened AFTER UPDATE OF ended_at ON jobs
            WHEN NEW.ended_at IS NOT OLD.ended_at AND OLD.usage_settled_at IS NOT NULL
        BEGIN
            DELETE FROM gpu_runs WHERE job_id = NEW.id;
            DELETE FROM gpu_curves WHERE job_id = NEW.id;
            DELETE FROM journal_seen WHERE journal = rtrim(NEW.job_dir, '/') || '/journal';
        END""",
    ],
]

SCHEMA_VERSION = len(MIGRATIONS)
