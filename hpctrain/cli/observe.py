"""`hpctrain metrics` and `hpctrain cost`: what jobs did and what they spent (imports only click at load)."""

from __future__ import annotations

import json
from typing import Any

import click

from hpctrain.cli.common import account_budgets, make_console, site_option
from hpctrain.cli.output import json_text
from hpctrain.cli.types import INDEX
from hpctrain.jobs.accounting import GROUPS

FIRST = ("loss", "lr", "step_time_s", "tokens_per_s", "data_wait_s")


def _refreshed(site: str | None, no_refresh: bool) -> tuple[list[tuple[Any, Any]], Any]:
    """The sites (config, client) and their ledger, with job states and journals folded in first unless told not to."""
    from hpctrain.cli.common import open_sites, refresh_sites

    sites, ledger = open_sites(site)
    if not no_refresh:
        refresh_sites(ledger, sites)
    return sites, ledger


@click.command()
@click.argument("job")
@site_option
@click.option("--name", "names", multiple=True, help="only this metric (repeatable)")
@click.option("--task", type=INDEX, default=None, help="only this array task")
@click.option("--tail", type=INDEX, default=20, show_default=True, help="the last N steps (0: all)")
@click.option("--json", "as_json", is_flag=True, help="one object per step")
@click.option("--no-refresh", is_flag=True, help="the ledger as it is, without folding in new journal records")
def metrics(
    job: str, site: str | None, names: tuple[str, ...], task: int | None, tail: int, as_json: bool, no_refresh: bool
) -> None:
    """Step metrics of JOB (loss, lr, step time, data wait, tokens/s, ...) from the ledger, with its evaluation jobs'
    values as EVALUATOR:METRIC at their checkpoint's step."""
    from hpctrain.cli.common import find_job

    _, ledger = _refreshed(site, no_refresh)
    with ledger:
        row = find_job(ledger, job)
        found = (
            ledger.metrics.tail(row["id"], tail, task, names) if tail else ledger.metrics.of_job(row["id"], task, names)
        )
        evaluated = [
            e for e in ledger.evaluations.of_job(row["id"]) if e["metrics_json"] and task in (None, e["task_index"])
        ]
    steps: dict[tuple[int, int], dict[str, Any]] = {}
    for m in found:
        steps.setdefault((m["task_index"], m["step"]), {"task": m["task_index"], "step": m["step"]})[m["name"]] = m[
            "value"
        ]
    for e in evaluated:  # evaluation jobs' values, as "<evaluator>:<metric>"
        at = steps.setdefault((e["task_index"], e["step"]), {"task": e["task_index"], "step": e["step"]})
        at.update(
            {
                f"{e['evaluator']}:{k}": v
                for k, v in json.loads(e["metrics_json"] or "{}").items()
                if not names or f"{e['evaluator']}:{k}" in names
            }
        )
    steps = dict(sorted(steps.items()))
    shown = list(steps.values())[-tail:] if tail else list(steps.values())
    if as_json:
        click.echo("\n".join(json_text(s) for s in shown))
        return
    present = {k for s in shown for k in s} - {"task", "step"}
    columns = [n for n in FIRST if n in present] + sorted(present - set(FIRST))
    from rich.table import Table

    table = Table(title=f"metrics of job {row['id']} ({row['name']})", title_justify="left")
    for col in ("task", "step", *columns):
        table.add_column(col, justify="right")
    for s in shown:
        table.add_row(str(s["task"]), str(s["step"]), *("-" if s.get(c) is None else f"{s[c]:.6g}" for c in columns))
    make_console().print(table)


@click.command()
@site_option
@click.option("--by", type=click.Choice(GROUPS), default="account", show_default=True)
@click.option("--since", metavar="YYYY-MM-DD", default=None, help="count GPU time from this day on")
@click.option("--json", "as_json", is_flag=True)
@click.option("--no-refresh", is_flag=True, help="the ledger as it is, without asking Slurm")
@click.option(
    "--causes",
    is_flag=True,
    help="also the lost GPU time by cause, the GPU-hours held idle, the time queued after requeues",
)
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True, help="groups shown, most GPU-h first")
@click.option("--all", "show_all", is_flag=True, help="every group, not only the --top ones")
def cost(
    site: str | None,
    by: str,
    since: str | None,
    as_json: bool,
    no_refresh: bool,
    causes: bool,
    top: int,
    show_all: bool,
) -> None:
    """GPU-hours (sacct: GPUs x elapsed, every run, requeues included), the part lost to interruptions
    (work after a run's last checkpoint), goodput (productive steps over the GPU time of runs whose trainer
    journals its steps; --causes: the rest by cause) and cost at the site's prices, per account, user, sweep,
    job or partition: the --top groups by GPU-hours, the rest in one line (--all or --json: every group)."""
    from datetime import datetime

    from hpctrain.jobs.accounting import add_idle, cost_totals, overall, percent, pooled_goodput

    try:
        since_ts = datetime.fromisoformat(since).timestamp() if since is not None else None
    except ValueError:
        raise click.BadParameter(f"expected a date such as 2026-11-01, got {since!r}", param_hint="--since") from None
    sites, ledger = _refreshed(site, no_refresh)
    several = len(sites) > 1
    with ledger:
        # Each cluster's at its own prices; of several, each group is a cluster's (most GPU-hours first).
        of_site = [
            (cfg.name, g) for cfg, _ in sites for g in cost_totals(ledger, cfg.name, cfg.gpu_hour_price, by, since_ts)
        ]
        if several:
            of_site.sort(key=lambda pair: -pair[1].gpu_hours)
        groups = [g for _, g in of_site]
        if causes or as_json:
            add_idle(ledger, groups, since_ts)
        budgets = (
            {(cfg.name, account): b for cfg, _ in sites for account, b in account_budgets(cfg, ledger).items()}
            if by == "account" and not no_refresh
            else {}
        )
    shown = len(groups) if show_all or as_json else top
    rows: list[dict[str, Any]] = [  # of the groups shown only: --by job over a week is some 20,000
        {
            **({"site": name} if several else {}),
            by: g.key,
            "jobs": len(g.jobs),
            "runs": g.runs,
            "gpu_hours": g.gpu_hours,
            "lost_gpu_hours": g.lost_gpu_hours,
            "goodput": g.goodput,
            "cause_gpu_hours": g.causes,
            "idle_gpu_hours": g.idle_gpu_hours,
            "queued_after_requeue_s": g.queue_s,
            "cost": g.cost,
        }
        for name, g in of_site[:shown]
    ]
    for (name, _), r in zip(of_site, rows):
        if (budget := budgets.get((name, r[by]))) is not None:
            r.update(
                budget_gpu_hours=budget.limit / 60,
                budget_spent_gpu_hours=budget.used / 60,
                budget_left_gpu_hours=budget.left / 60,
            )
    if as_json:
        click.echo(json_text(rows))
        return
    from rich.table import Table

    names = ", ".join(cfg.name for cfg, _ in sites)
    table = Table(title=f"GPU-hours on {names}" + (f" since {since}" if since else ""), title_justify="left")
    budget_cols = ("budget GPU-h", "spent (Slurm)", "left") if budgets else ()
    for col in (
        *(["site"] if several else []),
        by,
        "jobs",
        "runs",
        "GPU-h",
        "lost GPU-h",
        "goodput",
        "cost",
        *budget_cols,
    ):
        table.add_column(col, justify="left" if col in (by, "site") else "right")
    for r in rows:
        budget = (
            [
                f"{r[k]:.1f}" if k in r else "-"
                for k in ("budget_gpu_hours", "budget_spent_gpu_hours", "budget_left_gpu_hours")
            ]
            if budgets
            else []
        )
        table.add_row(
            *([r["site"]] if several else []),
            str(r[by] if r[by] is not None else "-"),
            str(r["jobs"]),
            str(r["runs"]),
            f"{r['gpu_hours']:.3f}",
            f"{r['lost_gpu_hours']:.3f}",
            percent(r["goodput"]),
            f"{r['cost']:.2f}",
            *budget,
        )
    rest = [(f"{len(groups) - shown} more (--all)", groups[shown:])] if groups[shown:] else []
    summed = [*rest, ("total", groups)]  # the groups not shown, in one line, and all of them
    for label, summed_groups in summed:
        table.add_row(
            *([""] if several else []),
            label,
            str(sum(len(g.jobs) for g in summed_groups)),
            str(sum(g.runs for g in summed_groups)),
            f"{sum(g.gpu_hours for g in summed_groups):.3f}",
            f"{sum(g.lost_gpu_hours for g in summed_groups):.3f}",
            percent(pooled_goodput(summed_groups)),
            f"{sum(g.cost for g in summed_groups):.2f}",
            *(["", "", ""] if budgets else []),
        )
    console = make_console()
    console.print(table)
    if causes:
        lines: list[tuple[object, Any, bool]] = [
            (f"{name}: {g.key}" if several else g.key, g, False) for name, g in of_site[:shown]
        ]
        lines += [(label, overall(g), label == "total") for label, g in summed]
        console.print(_causes_table(by, lines))


def _causes_table(by: str, groups: list[tuple[object, Any, bool]]) -> Any:
    """Each group's lost GPU time by cause, a row each, its GPU-hours held idle and the time its runs queued after
    requeues: those that are not zero, or (``every``: the total) all of them. Names stay whole in any terminal, as
    20-odd columns' did not."""
    from rich.table import Table

    from hpctrain.jobs.accounting import percent
    from hpctrain.jobs.goodput import LOST

    table = Table(title="lost GPU time by cause", title_justify="left")
    for col in (by, "cause", "GPU-h", "of all GPU-h"):
        table.add_column(col, justify="left" if col in (by, "cause") else "right")
    for key, total, every in groups:

        def row(name: str, hours: float, total: Any = total) -> tuple[str, str, str]:
            return name, f"{hours:.3f}", percent(hours / total.gpu_hours) if total.gpu_hours else "-"

        rows = [row(c, total.causes.get(c, 0.0)) for c in LOST if total.causes.get(c, 0.0) or every]
        if total.idle_gpu_hours or every:  # beside the causes: an idle GPU's time may be productive for its job
            rows.append(row("GPUs held idle", total.idle_gpu_hours))
        if total.queue_s or every:
            rows.append(("queued after requeues (hours)", f"{total.queue_s / 3600:.3f}", "-"))
        for i, cells in enumerate(rows):
            table.add_row("" if i else "-" if key is None else str(key), *cells)
        table.add_section()
    return table


@click.command()
@site_option
@click.option("--account", "accounts", multiple=True, help="only this account (repeatable)")
@click.option("--json", "as_json", is_flag=True)
def quota(site: str | None, accounts: tuple[str, ...], as_json: bool) -> None:
    """Your limits: for each of your accounts and the QOS they allow, every association and QOS limit
    Slurm enforces, what is in use (running GPUs, jobs) or spent (GPU-minutes) against it, and what is left."""
    import getpass

    from hpctrain.cli.common import open_site
    from hpctrain.submit.quota import user_limits

    cfg, ledger, client = open_site(site)
    with ledger:
        limits = user_limits(cfg, client, getpass.getuser(), ledger, fresh=True, accounts=list(accounts) or None)
    if as_json:
        click.echo(json_text([lim.as_dict() for lim in limits]))
        return
    from rich.table import Table

    from hpctrain.slurm.assoc_mgr import number

    table = Table(title=f"limits on {cfg.name}" + ("" if limits else ": none set"), title_justify="left")
    for col in ("where", "limit", "slurm", "value", "in use / spent", "left"):
        table.add_column(col, justify="right" if col in ("value", "in use / spent", "left") else "left")
    for lim in limits:
        budget = lim.unit == "GPU-minutes"  # in GPU-hours, as `hpctrain cost` shows budgets
        amount = (lambda x: f"{x / 60:.1f}") if budget else number
        used, left = ("-", "-") if lim.how == "per job" else (amount(lim.used), amount(lim.left))
        table.add_row(lim.scope, "GPU-hours" if budget else lim.what, lim.slurm_name, amount(lim.limit), used, left)
    make_console().print(table)
