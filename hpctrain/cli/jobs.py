"""CLI commands for the job lifecycle on the login node: submit, status, show, cancel."""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import click

from hpctrain.cli.common import (
    find_job,
    make_console,
    open_site,
    open_sites,
    own_site,
    quota_limits,
    refresh_sites,
    site_option,
    warn,
)
from hpctrain.cli.output import json_text, styled, visible
from hpctrain.cli.types import INDEX, Finite
from hpctrain.jobs.overview import LISTED_WHOLE, Note, Overview, counted, overview


def _steps(start: int | None, end: int | None) -> str:
    """'120 -> 180 (+60)': the newest checkpoint step when a run started and when it ended."""
    if start is None and end is None:
        return "-"
    gained = f" (+{end - start})" if start is not None and end is not None else ""
    return f"{'?' if start is None else start} -> {'?' if end is None else end}{gained}"


def _when(ts: float | None) -> str:
    return time.strftime("%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@site_option
@click.option("--dry-run", is_flag=True, help="print the rendered script(s); submit and record nothing")
@click.option("--array", "array", metavar="N[%T]", help="run N copies as an array, at most T at once")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.option("--wait", is_flag=True, help="wait until the job has finished; exit 1 unless it completed")
@click.option(
    "--soonest", is_flag=True, help="to the partition and account where it would start soonest (see `hpctrain where`)"
)
@click.option(
    "--race",
    "runners",
    type=click.IntRange(2, 12),
    default=None,
    metavar="K",
    help="to the K soonest at once: the first to start runs it, the others are cancelled",
)
def submit(
    spec_path: str,
    site: str | None,
    dry_run: bool,
    array: str | None,
    as_json: bool,
    wait: bool,
    soonest: bool,
    runners: int | None,
) -> None:
    """Render SPEC for the site and submit it (a job, or arrays split past MaxArraySize)."""
    import getpass

    from hpctrain.config import load_job_spec
    from hpctrain.submit import Submitter
    from hpctrain.submit.soonest import as_submitted, chosen, rank_sites

    if runners is not None and (dry_run or wait):
        raise click.UsageError("--race submits: not with --dry-run or --wait")
    spec = load_job_spec(spec_path)
    if array is not None:
        spec.array = _array_option(array)
    sites, ledger = open_sites(site)
    if len(sites) > 1 and not soonest and runners is None:
        raise click.UsageError("--site names several clusters: with --soonest (which picks one) or --race only")
    cfg, client = sites[0]
    with ledger:
        if runners is not None:
            _race(spec, spec_path, sites, ledger, runners, as_json)
            return
        placement = None
        if soonest:
            ranking = rank_sites(spec, sites, getpass.getuser(), spec_path, ledger, fresh=True)
            placement = chosen(ranking, spec_path)
            cfg, client = next((c, k) for c, k in sites if c.name == (placement.site or cfg.name))
            spec = as_submitted(spec, placement, cfg)
        sub = Submitter(cfg, ledger, client).submit(spec, spec_path, dry_run=dry_run, placement=placement)
        for why in sub.placement.waits:
            click.echo(f"hpctrain: warning: {why}", err=True)
        if dry_run:
            click.echo("\n".join(sub.scripts), nl=False)
            return
        if as_json:
            click.echo(
                json_text(
                    {
                        "ledger_ids": sub.ledger_ids,
                        "slurm_ids": sub.slurm_ids,
                        "site": cfg.name,
                        "account": sub.placement.account,
                        "partition": sub.placement.partition,
                        "qos": sub.placement.qos,
                        "nodes": spec.resources.nodes,
                        "time_s": spec.resources.time or cfg.defaults.time,
                        "reason": sub.placement.reason,
                        "waits": list(sub.placement.waits),
                    }
                )
            )
        else:
            for lid, sid in zip(sub.ledger_ids, sub.slurm_ids):
                click.echo(f"submitted {spec.name}: ledger id {lid}, slurm job {sid}")
            p = sub.placement
            click.echo(f"  {p.partition}/{p.qos} as {p.account} ({p.reason})")
        if not wait:
            return
        from hpctrain.jobs.poll import wait_finished

        states = wait_finished(ledger, client, cfg.name, sub.ledger_ids)
    click.echo(f"finished: {', '.join(f'{i} {s}' for i, s in states.items())}")
    sys.exit(0 if set(states.values()) == {"COMPLETED"} else 1)


def _race(spec: Any, spec_path: str, sites: list[tuple[Any, Any]], ledger: Any, runners: int, as_json: bool) -> None:
    """`submit --race K`: the K soonest placements at once, over every site given (hpctrain.submit.racing)."""
    import getpass

    from hpctrain.submit import Submitter
    from hpctrain.submit.racing import submit_race
    from hpctrain.submit.soonest import rank_sites

    ranking = rank_sites(spec, sites, getpass.getuser(), spec_path, ledger, fresh=True)
    for line in ranking.left_out if len(sites) > 1 else []:
        click.echo(visible(f"hpctrain: warning: left out: {line}"), err=True)
    submitters = [Submitter(cfg, ledger, client) for cfg, client in sites]
    subs, left_out = submit_race(submitters, spec, spec_path, ranking, runners)
    for line in left_out:
        click.echo(visible(f"hpctrain: warning: not in the race: {line}"), err=True)
    if as_json:
        click.echo(
            json_text(
                {
                    "ledger_ids": [i for s in subs for i in s.ledger_ids],
                    "slurm_ids": [i for s in subs for i in s.slurm_ids],
                    "runners": [
                        {
                            "site": s.placement.site or sites[0][0].name,
                            "partition": s.placement.partition,
                            "account": s.placement.account,
                            "qos": s.placement.qos,
                        }
                        for s in subs
                    ],
                }
            )
        )
        return
    click.echo(f"submitted {spec.name} to a race of {len(subs)}: the first to start runs it")
    for s in subs:
        p = s.placement
        on = f"{p.site}: " if len(sites) > 1 else ""
        click.echo(
            f"  ledger id {s.ledger_ids[0]}, slurm job {s.slurm_ids[0]}: {on}{p.partition}/{p.qos} as {p.account}"
        )


def _array_option(text: str) -> Any:
    """--array N[%T] as an ArraySpec: N copies, at most T at once."""
    from pydantic import ValidationError

    from hpctrain.config.job import ArraySpec

    m = re.fullmatch(r"([0-9]{1,9})(?:%([0-9]{1,9}))?", text)
    try:
        if m is None:
            raise ValueError
        return ArraySpec(count=int(m[1]), throttle=int(m[2]) if m[2] else None)
    except (ValueError, ValidationError):
        raise click.BadParameter(
            f"expected N or N%T, whole numbers from 1 (N at most 100000), got {text!r}", param_hint="--array"
        ) from None


WAITS_EVERY_S = 60.0


def _status_table(rows: Sequence[Mapping[str, Any]], title: str, sites: bool = False) -> Any:
    """The submissions a row each; ``sites``: each with its cluster (rows of several)."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    columns = ("id", "site", "name", "slurm id", "state", "tasks", "restarts", "preempted", "account/qos", "submitted")
    for col in columns if sites else [c for c in columns if c != "site"]:
        table.add_column(col)
    for r in rows:
        tasks = r["task_states"].replace(",", " ") if r["task_states"] else "-"
        table.add_row(
            str(r["id"]),
            *([r["site"]] if sites else []),
            r["name"],
            r["slurm_job_id"] or "-",
            r["state"],
            tasks,
            str(r["restarts"]),
            str(r["preemptions"]),
            f"{r['account']}/{r['qos']}",
            _when(r["submitted_at"]),
        )
    return table


def _sessions(ledger: Any, rows: Sequence[Mapping[str, Any]]) -> dict[int, Any]:
    """The notebook sessions among the running jobs (the module that reads them is imported only when one is)."""
    running = [r["id"] for r in rows if r["state"] == "RUNNING"]
    if not ledger.jobs.session_dirs(running):
        return {}
    from hpctrain.interactive.connect import running_sessions

    return running_sessions(ledger, running)


def _notes(
    alerts: Mapping[int, Sequence[str]], reasons: Mapping[int, str], sessions: Mapping[int, Any]
) -> dict[int, list[Note]]:
    """What status says of each submission below its table: its alerts, why it waits, its session."""
    notes: dict[int, list[Note]] = {}
    for job_id, found in alerts.items():
        notes.setdefault(job_id, []).append(Note(job_id, "; ".join(found), alert=True))
    for job_id, why in reasons.items():
        notes.setdefault(job_id, []).append(Note(job_id, f"waits: {why}"))
    for job_id, s in sessions.items():
        idle = "not answering" if s["idle_s"] is None else f"idle {s['idle_s'] / 60:.0f} min"
        notes.setdefault(job_id, []).append(
            Note(job_id, f"session: {s['url']} (token in {s['token_file']}; {idle}; ends after {s['idle_minutes']:g})")
        )
    return notes


def _print_notes(console: Any, notes: Sequence[Note], more: int) -> None:
    for note in notes:
        if note.alert:
            console.print(styled("  ", (f"job {note.job_id}", "bold red"), f": {note.text}"))
        else:
            console.print(f"  job {note.job_id} {note.text}", soft_wrap=note.text.startswith("session: "))
    if more:
        console.print(f"  and {more:,} more: `hpctrain status --long` lists every submission with all of them")


def _print_overview(console: Any, site: str, view: Overview, submissions: int) -> None:
    from rich.table import Table

    table = Table(
        title=f"hpctrain status: site {site}: {submissions:,} active submissions, by group", title_justify="left"
    )
    for col in ("group", "submissions", "states", "tasks", "restarts", "preempted"):
        table.add_column(col)
    for g in view.groups:
        tasks = counted(g.tasks) if g.tasks else "-"
        table.add_row(g.name, f"{g.submissions:,}", counted(g.states), tasks, f"{g.restarts:,}", f"{g.preemptions:,}")
    console.print(table)
    if view.more_groups:
        console.print(f"  and {view.more_groups:,} more groups; `hpctrain status --long` lists every submission")
    _print_notes(console, view.notes, view.more_notes)


@click.command()
@site_option
@click.option("--all", "show_all", is_flag=True, help="include finished jobs, each on its line")
@click.option(
    "--long", "long", is_flag=True, help=f"every active submission on its line (else past {LISTED_WHOLE}: by group)"
)
@click.option("--json", "as_json", is_flag=True, help="print rows as JSON")
@click.option("--watch", is_flag=True, help="keep polling, backing off while nothing changes")
@click.option(
    "--interval",
    type=Finite(0.1, 86400),
    default=5.0,
    show_default=True,
    help="first poll interval (s) with --watch",
)
@click.option(
    "--max-interval",
    type=Finite(0.1, 86400),
    default=300.0,
    show_default=True,
    help="longest poll interval (s) with --watch",
)
@click.option("--count", type=click.IntRange(1, 10**9), default=None, help="stop --watch after this many polls")
@click.option("--no-refresh", is_flag=True, help="show the ledger as it is, without asking Slurm")
@click.option(
    "--limit", type=click.IntRange(1, 10**9), default=200, show_default=True, help="jobs shown with --all (active: all)"
)
def status(
    site: str | None,
    show_all: bool,
    long: bool,
    as_json: bool,
    watch: bool,
    interval: float,
    max_interval: float,
    count: int | None,
    no_refresh: bool,
    limit: int,
) -> None:
    """The active submissions, each on its line while there are at most 20 (an array's tasks counted by state, its
    restarts), else counted by group and state; then the ones that need your eye: alerts (stalled, data-bound, ...),
    why they wait, their sessions. One sacct call per poll for all of them (and their journals), cached in the
    ledger."""
    from hpctrain.jobs.alerts import job_alerts
    from hpctrain.jobs.gpus import uses_of
    from hpctrain.jobs.pending import waiting, waits
    from hpctrain.jobs.poll import job_summaries, next_interval, submissions

    sites, ledger = open_sites(site)
    several, names = len(sites) > 1, ", ".join(cfg.name for cfg, _ in sites)
    console = make_console()
    wait, polls = interval, 0
    reasons: dict[int, str] = {}
    reasons_at = -WAITS_EVERY_S
    with ledger:
        while True:
            # Backs off on job state changes only: new metrics arrive all the time.
            changed = 0 if no_refresh else refresh_sites(ledger, sites)
            polls += 1
            # Why jobs wait is the controller's to say (one squeue): once a run, at most once a minute under --watch.
            ask = not no_refresh and time.monotonic() - reasons_at >= WAITS_EVERY_S
            rows: list[Any] = []
            alerts: dict[int, list[str]] = {}
            asked: dict[int, str] = {}
            for cfg, client in sites:
                listed = job_summaries(ledger, cfg.name, active_only=not show_all, limit=limit)
                of_site = submissions(listed)
                rows += listed if several else of_site
                alerts.update(job_alerts(ledger, of_site, cfg.alerts))
                if ask:
                    asked.update(waiting(of_site, client, functools.partial(quota_limits, cfg, client, ledger)))
            if ask:
                reasons, reasons_at = asked, time.monotonic()
            if several:  # newest first across the clusters, as one cluster's are; --all: the newest `limit`
                rows = sorted(submissions(rows), key=lambda r: -r["id"])[: limit if show_all else None]
            pending = {r["id"] for r in rows if waits(r)}
            reasons = {job_id: why for job_id, why in reasons.items() if job_id in pending}
            sessions = _sessions(ledger, rows)
            if as_json:
                with ledger.reading():
                    gpus = uses_of(ledger, (r["id"] for r in rows))
                click.echo(
                    json_text(
                        [
                            {
                                **r,
                                "alerts": alerts.get(r["id"], []),
                                "waiting": reasons.get(r["id"]),
                                "session": sessions.get(r["id"]),
                                "gpus": gpus[r["id"]].as_json() if r["id"] in gpus else None,
                            }
                            for r in rows
                        ]
                    )
                )
            elif not rows:
                console.print(
                    f"no jobs of site {names} in the ledger"
                    if show_all
                    else f"no active jobs on site {names}; `hpctrain status --all` lists finished ones too"
                )
            else:
                notes = _notes(alerts, reasons, sessions)
                if show_all or long or len(rows) <= LISTED_WHOLE:
                    console.print(_status_table(rows, f"hpctrain status: site {names}", several))
                    _print_notes(console, [note for lines in notes.values() for note in lines], 0)
                else:
                    _print_overview(console, names, overview(rows, notes), len(rows))
            if not watch or (count is not None and polls >= count):
                return
            wait = next_interval(wait, interval, max_interval, changed > 0)
            click.echo(f"next poll in {wait:g}s ({changed} changed)", err=True)
            time.sleep(wait)


@click.command()
@click.argument("job")
@site_option
@click.option("--json", "as_json", is_flag=True)
@click.option("--lineage", "show_lineage", is_flag=True, help="what the job ran: code, data, parameters, versions")
@click.option("--task", type=INDEX, default=None, help="only this array task's runs")
@click.option("--state", default=None, help="only the runs of the array tasks in this state (RUNNING, FAILED, ...)")
def show(job: str, site: str | None, as_json: bool, show_lineage: bool, task: int | None, state: str | None) -> None:
    """One job by ledger id: placement and why, array tasks, attempts (requeues, preemptions), events. An array of
    more than 20 tasks shows its tasks counted by state; --task or --state lists runs."""
    from hpctrain.jobs.arrays import newest_events, parts_of, runs_view
    from hpctrain.jobs.goodput import job_goodput
    from hpctrain.jobs.gpus import gpus_line, idle_words, uses_of
    from hpctrain.jobs.pending import waiting
    from hpctrain.jobs.shard_cache import cache_counts, cache_words
    from hpctrain.jobs.stragglers import latest
    from hpctrain.ledger.attempts import outcome
    from hpctrain.slurm.states import TERMINAL

    cfg, ledger, client = open_site(site)
    with ledger:
        row = find_job(ledger, job)
        if row["state"] not in TERMINAL:  # Slurm is asked why it waits: its own cluster's
            cfg, client = own_site(cfg, client, row["site"], row["id"])
        if show_lineage:
            original = _rerun_of(ledger, row)
            _print_lineage(row, original)
            return
        detail = {
            "job": row,
            "array_tasks": ledger.jobs.tasks(row["id"]),
            "attempts": ledger.attempts.of_job(row["id"]),
            "events": ledger.events.of_job(row["id"]),
            "evaluations": ledger.evaluations.of_job(row["id"]),
            "waiting": waiting([row], client, lambda: quota_limits(cfg, client, ledger)).get(row["id"]),
        }
        segments = ledger.segments.of_jobs([row["id"]])
        gpus = uses_of(ledger, [row["id"]]).get(row["id"])
        cached = cache_counts(ledger, row["id"])
        slow = latest(ledger, row["id"])
        group = ledger.jobs.in_group(row["group_id"]) if row["group_id"] is not None else [row]
        parts = parts_of(group, [t for j in group for t in ledger.jobs.tasks(j["id"])]) if len(group) > 1 else []
    view = runs_view(row["id"], detail["array_tasks"], detail["attempts"], task, state)
    if task is not None or state is not None:
        shown = {r["task_index"] for r in view.runs}
        detail["array_tasks"] = [t for t in detail["array_tasks"] if t["task_index"] in shown]
        detail["attempts"] = view.runs
        segments = [s for s in segments if s["task_index"] in shown]
    detail["gpus"] = gpus and gpus.as_json()
    detail["cache"] = cached
    detail["stragglers"] = slow and {"step": slow[0], "ranks": [s.__dict__ for s in slow[1]]}
    detail["submission"] = [p.__dict__ for p in parts]
    measured = {(s["task_index"], s["attempt"]) for s in segments}  # runs whose trainer journaled its steps
    goodput = {
        run: good for run, good in job_goodput(detail["attempts"], segments, time.time()).items() if run in measured
    }
    detail["goodput"] = [
        {"task_index": task, "attempt": attempt, "seconds": good.seconds, "queue_s": good.queue_s}
        for (task, attempt), good in goodput.items()
    ]
    if as_json:
        click.echo(json_text(detail, default=str))
        return
    from rich.table import Table

    console = make_console()
    console.print(
        styled(
            (row["name"], "bold"), f" ledger id {row['id']}, slurm job {row['slurm_job_id']}: ", (row["state"], "bold")
        )
    )
    console.print(f"  {row['partition']}/{row['qos']} as {row['account']}: {row['choice_reason']}")
    if detail["waiting"]:
        console.print(f"  waits: {detail['waiting']}")
    console.print(f"  script {row['script_path']} (sha256 {row['script_sha256'] and row['script_sha256'][:12]})")
    if parts:
        console.print(_parts_table(parts, row["id"]))
    if view.by_state:
        counts = ", ".join(f"{n} {s}" for s, n in view.by_state.items())
        console.print(f"  tasks: {counts}" + ("; --task N or --state STATE lists their runs" * view.summarised))
    attempts = Table(title="attempts", title_justify="left")
    tasks = bool(row["is_array"])  # a plain job's runs have no task
    for col in ("task",) * tasks + (
        "attempt",
        "state",
        "cause",
        "ckpt steps",
        "then",
        "nodes",
        "start",
        "end",
        "gpus",
        "exit",
    ):
        attempts.add_column(col)
    for a in view.runs:
        attempts.add_row(
            *(str(a["task_index"]),) * tasks,
            str(a["attempt"]),
            a["state"] or "-",
            a["cause"] or "-",
            _steps(a["step_start"], a["step_end"]),
            outcome(a),
            a["node_list"] or "-",
            _when(a["started_at"]),
            _when(a["ended_at"]),
            str(a["alloc_gpus"] or "-"),
            a["exit_code"] or "-",
        )
    if not view.summarised:
        console.print(attempts)
    for a in view.runs:
        if a["requeued"] == 0 and a["cause"] != "completed":
            which = f"task {a['task_index']} " if a["task_index"] >= 0 else ""
            console.print(styled("  ", (f"{which}stopped after attempt {a['attempt']}", "bold"), f": {a['decision']}"))
    if gpus is not None:
        console.print(f"  {gpus_line(gpus)}")
        if said := idle_words(gpus, gpus.idle):
            console.print(styled("  ", ("idle GPUs", "bold"), f": {said}"))
    if cached is not None:
        console.print(f"  {cache_words(cached)}")
    if slow and slow[1]:
        console.print(f"  stragglers at step {slow[0]}: {', '.join(map(str, slow[1]))}")
    for (index, attempt), good in goodput.items() if not view.summarised else ():
        console.print(f"  {f'task {index} ' if index >= 0 else ''}attempt {attempt} time: {good.words()}")
    if detail["evaluations"]:
        console.print(_evaluations_table(detail["evaluations"], tasks))
    events, earlier = newest_events(detail["events"])
    if earlier:
        console.print(f"  {sum(earlier.values()):,} earlier events ({counted(earlier)}); --json lists them all")
    for e in events:
        console.print(f"  {_when(e['time'])} {e['kind']}: {e['message']}")


def _parts_table(parts: Sequence[Any], this: int) -> Any:
    """The jobs of a submission split past MaxArraySize, one a line, its tasks counted by state."""
    from rich.table import Table

    table = Table(
        title=f"submission: {len(parts)} jobs of {sum(p.tasks for p in parts):,} tasks (split past MaxArraySize)",
        title_justify="left",
    )
    for col in ("ledger id", "slurm job", "state", "tasks", "by state"):
        table.add_column(col)
    for p in parts:
        mark = " (this)" if p.id == this else ""
        table.add_row(f"{p.id}{mark}", p.slurm_job_id or "-", p.state, f"{p.tasks:,}", counted(p.by_state))
    return table


def _evaluations_table(rows: list[Any], tasks: bool) -> Any:
    """The job's evaluations of its checkpoints: step, evaluator, state, its job, its values or its error."""
    from rich.table import Table

    from hpctrain.ledger.evaluations import outcome

    table = Table(title="evaluations", title_justify="left")
    for col in ("task",) * tasks + ("step", "evaluator", "state", "eval job", "values"):
        table.add_column(col)
    for r in rows:
        columns = (str(r["step"]), r["evaluator"], r["state"], str(r["eval_job_id"] or "-"), outcome(r))
        table.add_row(*(str(r["task_index"]),) * tasks, *columns)
    return table


def _rerun_of(ledger: Any, row: dict[str, Any]) -> dict[str, Any] | None:
    origin = json.loads(row["lineage_json"] or "{}").get("rerun_of")
    return ledger.jobs.get(origin) if origin is not None else None


def _print_lineage(row: dict[str, Any], original: dict[str, Any] | None) -> None:
    """The recorded lineage, how the entry point's code stands now, and what differs from the job it reran."""
    from hpctrain.submit.lineage import code_state, differences, flatten

    recorded = json.loads(row["lineage_json"] or "{}")
    if not recorded:
        click.echo(f"job {row['id']}: no lineage recorded")
        return
    for key, value in sorted(flatten(recorded).items()):
        click.echo(visible(f"{key}: {value}"))
    code = recorded.get("code") or {}
    if code.get("entry_point"):
        from pathlib import Path

        now = code_state(Path(code["entry_point"])) if Path(code["entry_point"]).exists() else {}
        changed = [k for k in ("commit", "dirty", "diff_sha256", "file_sha256") if now.get(k) != code.get(k)]
        click.echo(
            "code now: "
            + ("as recorded" if not changed else "differs (" + ", ".join(f"{k} {now.get(k)!r}" for k in changed) + ")")
        )
    if original is not None:
        diff = differences(json.loads(original["lineage_json"] or "{}"), recorded)
        click.echo(f"rerun of job {original['id']}: " + ("identical lineage" if not diff else "lineage differs"))
        for line in diff:
            click.echo(f"  {visible(line)}")


@click.command()
@click.argument("job")
@site_option
def rerun(job: str, site: str | None) -> None:
    """Submit JOB again exactly: its recorded spec, from its directory; says what differs from the first time."""
    from hpctrain.submit.rerun import rerun as submit_again

    cfg, ledger, client = open_site(site)
    with ledger:
        row = find_job(ledger, job)
        cfg, client = own_site(cfg, client, row["site"], row["id"])
        done = submit_again(cfg, ledger, client, row)
    click.echo(
        f"rerun of job {done.original}: ledger id {done.submission.ledger_ids[0]}, "
        f"slurm job {done.submission.slurm_ids[0]}"
    )
    click.echo(
        "lineage: identical"
        if not done.differences
        else "lineage differs:\n" + "\n".join(f"  {visible(d)}" for d in done.differences)
    )


@click.command()
@click.argument("job")
@site_option
@click.option("-f", "--follow", is_flag=True, help="go on printing lines as they are written until the job ends")
@click.option("--task", type=INDEX, default=None, help="only this array task's log")
@click.option("--attempt", type=INDEX, default=None, help="only this run's lines (see `show`)")
@click.option("--rank", type=INDEX, default=None, help="only this rank's lines (a multi-task job)")
def logs(job: str, site: str | None, follow: bool, task: int | None, attempt: int | None, rank: int | None) -> None:
    """The output of JOB across its runs and array tasks, with a mark where each run began."""
    from hpctrain.errors import HpctrainError
    from hpctrain.jobs.logs import show_logs
    from hpctrain.slurm.states import TERMINAL

    cfg, ledger, client = open_site(site)
    with ledger:
        row = find_job(ledger, job)
        if follow and row["state"] not in TERMINAL:  # followed by polls of its own cluster
            cfg, client = own_site(cfg, client, row["site"], row["id"])
        if task is not None and not row["is_array"]:
            raise HpctrainError(f"job {row['id']} is not an array: it has no task {task}")
        if row["job_dir"] is None:
            raise HpctrainError(f"job {row['id']} has no job directory (it was never submitted: {row['state']})")
        show_logs(ledger, client, cfg.name, row, click.echo, task, attempt, rank, follow)


@click.command()
@click.argument("job", required=False)
@site_option
@click.option("--sweep", "sweep", help="cancel every job of this sweep")
def cancel(job: str | None, site: str | None, sweep: str | None) -> None:
    """Cancel a job (all chunks of its submission) or every job of a sweep, in one scancel call."""
    from hpctrain.jobs.cancel import cancel_jobs, cancel_sweep

    if bool(job) == bool(sweep):
        raise click.UsageError("give a JOB or --sweep, not both")
    cfg, ledger, client = open_site(site)
    with ledger:
        if job:
            row = find_job(ledger, job)
            cancelled = cancel_jobs(ledger, lambda name: own_site(cfg, client, name, row["id"])[1], row)
        else:
            assert sweep  # one of the two, as checked above
            cancelled = cancel_sweep(ledger, client, sweep)
    click.echo(f"cancelled {len(cancelled)} job(s): {' '.join(cancelled) or '-'}")


@click.command()
@site_option
def reconcile(site: str | None) -> None:
    """Fold job states (one sacct call) and compute-node journals (checkpoints, metrics, events) into the ledger;
    submit the evaluation jobs of new checkpoints of jobs whose spec says [eval] on_checkpoint."""
    from hpctrain.evaluate.submit import follow_all
    from hpctrain.jobs.reconcile import reconcile as run_reconcile
    from hpctrain.ledger.jobs import JOURNALS_READ_S

    cfg, ledger, client = open_site(site)
    with ledger:
        result = warn(run_reconcile(ledger, client, cfg.name))
        evaluations, failures = follow_all(ledger, cfg, time.time() - JOURNALS_READ_S)
    click.echo(
        f"reconciled: {result.changed_jobs} job(s) changed state, "
        f"{result.records} new record(s) from {result.journals} journal(s)"
    )
    for r in evaluations:  # [eval] on_checkpoint
        t = r.target
        click.echo(visible(f"  job {t.job_id} step {t.step}: evaluating with {r.evaluator}, ledger id {r.eval_job_id}"))
    if result.evaluations_failed:
        click.echo(f"  {result.evaluations_failed} evaluation job(s) ended without a result (`hpctrain eval --retry`)")
    for line in result.unsent:
        click.echo(visible(f"  {line}"))
    for d in result.decisions:
        task = f" task {d.task_index}" if d.task_index >= 0 else ""
        click.echo(visible(f"  job {d.job_id}{task}: {'requeued' if d.requeued else 'stopped'}: {d.why}"))
    for line in failures:  # one job's evaluations that could not be submitted: the others' were
        click.echo(visible(f"hpctrain: error: evaluations of {line}"), err=True)
    if failures:
        sys.exit(1)
