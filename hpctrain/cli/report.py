"""`hpctrain report JOB|SWEEP|--account [NAME]` (imports only click at module load)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from hpctrain.cli.common import require, site_option
from hpctrain.cli.output import visible


@click.command()
@click.argument("target", metavar="[JOB|SWEEP]", required=False)
@click.option(
    "--account",
    metavar="[NAME]",
    is_flag=False,
    flag_value="",
    default=None,
    help="GPU-hours of account NAME over time (every account without NAME)",
)
@click.option(
    "--since",
    type=click.DateTime(["%Y-%m-%d"]),
    metavar="YYYY-MM-DD",
    default=None,
    help="with --account: from this day on (local time; default: all time)",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="the HTML file (default: report-job-<JOB>.html, report-sweep-<SWEEP>.html, "
    "report-account-<NAME>.html or report-accounts.html)",
)
@site_option
def report(target: str | None, account: str | None, since: datetime | None, out: str | None, site: str | None) -> None:
    """Write a self-contained HTML page with PNG plots, viewable without a server: a job by ledger id (loss,
    throughput, checkpoint durations, data wait; its first and last loss are printed too), a sweep by name, or
    GPU-hours per account over time."""
    from hpctrain.cli.common import account_budgets, find_job, open_site
    from hpctrain.errors import HpctrainError
    from hpctrain.report import account_report, job_report, loss_summary, sweep_report
    from hpctrain.report.collect import job_data

    if (target is None) == (account is None):
        raise click.UsageError("give a JOB (ledger id), a SWEEP (name) or --account [NAME]")
    if since is not None and account is None:
        raise click.UsageError("--since goes with --account")
    cfg, ledger, _ = open_site(site)
    summary: list[str] = []
    with ledger:
        if target is None:  # --account
            html = account_report(
                ledger, cfg, account or None, since.timestamp() if since else None, account_budgets(cfg, ledger)
            )
            what = f"account-{account}" if account else "accounts"
        elif target.isascii() and target.isdigit():
            job_id = find_job(ledger, target)["id"]
            data = job_data(ledger, job_id)  # read once: the page and the printed loss
            html, what, summary = job_report(ledger, cfg, job_id, data), f"job-{target}", loss_summary(data)
        else:
            require("matplotlib", "optuna")
            html, what = sweep_report(ledger, cfg, target), f"sweep-{target}"
    path = Path(out or f"report-{what}.html")
    try:
        path.write_text(html, encoding="utf-8")
    except OSError as exc:
        raise HpctrainError(f"{path}: cannot write the report: {exc.strerror}") from None
    click.echo(visible(f"wrote {path}"))
    for line in summary:
        click.echo(f"  {visible(line)}")
