"""`hpctrain compare JOB... | --sweep S`: runs side by side (imports only click at module load)."""

from __future__ import annotations

from pathlib import Path

import click

from hpctrain.cli.common import make_console, require, site_option
from hpctrain.cli.output import json_text
from hpctrain.cli.types import LEDGER_ID


@click.command()
@click.argument("jobs", nargs=-1, type=LEDGER_ID, metavar="[JOB]...")
@click.option("--sweep", "sweep_id", metavar="SWEEP", default=None, help="the trials of this sweep")
@click.option(
    "--metric",
    "metrics",
    multiple=True,
    metavar="NAME[@max]",
    help="a metric to compare: a training metric or an evaluation job's EVALUATOR:METRIC, such as heldout:eval/loss "
    "(repeatable; default: loss and eval/loss, with a sweep its own metric too); '@max' where higher is better "
    "('@min', the default, where lower is; the older ':max' where NAME is no evaluator)",
)
@click.option(
    "--html", "html_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="also write this page"
)
@click.option("--json", "as_json", is_flag=True, help="print the comparison as JSON")
@site_option
def compare(
    jobs: tuple[int, ...],
    sweep_id: str | None,
    metrics: tuple[str, ...],
    html_path: Path | None,
    as_json: bool,
    site: str | None,
) -> None:
    """Compare runs (ledger job ids; an array job's tasks each count as one) or a sweep's trials: what differs
    (hyperparameters, parameters, seed, layout, code, data, versions), final and best metrics, steps, GPU-hours,
    goodput, mean GPU utilization, attempts and preemptions; --html draws every run's curves overlaid."""
    from hpctrain.cli.common import open_site
    from hpctrain.errors import HpctrainError
    from hpctrain.report.compare import (
        DEFAULT_METRICS,
        compare_runs,
        evaluators_of,
        parse_metrics,
        runs_of_jobs,
        runs_of_sweep,
    )

    if bool(jobs) == bool(sweep_id):
        raise click.UsageError("give JOB ids or --sweep SWEEP")
    parse_metrics(metrics)  # a malformed one is refused before the ledger is read
    _, ledger, _ = open_site(site)
    with ledger:
        refs, own = runs_of_sweep(ledger, sweep_id) if sweep_id else (runs_of_jobs(ledger, jobs), {})
        wanted = {**own, **parse_metrics(metrics or DEFAULT_METRICS, evaluators_of(ledger, refs))}
        comparison = compare_runs(ledger, refs, wanted)
        if html_path is not None:
            require("matplotlib")
            from hpctrain.report.compare_page import compare_page

            html = compare_page(ledger, comparison)
            try:
                html_path.write_text(html, encoding="utf-8")
            except OSError as exc:
                raise HpctrainError(f"{html_path}: cannot write the page: {exc.strerror}") from None
    if as_json:
        click.echo(json_text(comparison.to_json()))
        return
    from rich.table import Table

    console = make_console()
    for title, (columns, rows) in (
        ("what differs", comparison.settings_table()),
        ("results", comparison.results_table()),
    ):
        table = Table(title=title, title_justify="left")
        for column in columns:
            table.add_column(column)
        for row in rows:
            table.add_row(*map(str, row))
        console.print(table)
    same = comparison.same
    console.print("same in every run: " + (", ".join(f"{k}={v}" for k, v in same.items()) or "-"), soft_wrap=True)
    if html_path is not None:
        console.print(f"wrote {html_path}")
