"""`hpctrain sweep start|tick|cron|install-tick|status|report` (imports only click at module load)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from hpctrain.cli.common import make_console, require, site_option
from hpctrain.cli.output import json_text, visible

DEFAULT_LOG = Path("~/.local/state/hpctrain/sweep-tick.log")  # scripts/sweep-tick-cron's too
# The tick's schedule and log, as `sweep cron` prints them and `sweep install-tick` writes them.
every_option = click.option(
    "--every", default=5, show_default=True, type=click.IntRange(1, 59), help="minutes between ticks"
)
log_option = click.option(
    "--log",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_LOG,
    show_default=True,
    help="the file each tick's output is appended to",
)


@click.group()
def sweep() -> None:
    """Hyperparameter sweeps driven by cron: grid, random or Bayesian, with early stopping."""


@sweep.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@site_option
@click.option("--tick/--no-tick", default=True, show_default=True, help="submit the first trials right away")
def start(spec_path: str, site: str | None, tick: bool) -> None:
    """Register the sweep in SPEC (again: no change); then tick it once."""
    from hpctrain.cli.common import open_site
    from hpctrain.sweep import store
    from hpctrain.sweep.spec import load_sweep_spec

    spec = load_sweep_spec(spec_path)
    cfg, ledger, client = open_site(site)
    with ledger:
        swp, created = store.register(ledger, spec, Path(spec_path))
        click.echo(
            f"sweep {swp.id}: {'registered' if created else 'already registered'} "
            f"({spec.method}, up to {spec.max_trials} trials, {spec.max_parallel} at once)"
        )
        if tick:
            _tick(cfg, ledger, client, [swp.id])


@sweep.command(name="tick")
@click.argument("sweeps", nargs=-1)
@site_option
def tick_command(sweeps: tuple[str, ...], site: str | None) -> None:
    """The cron entry: refresh (one sacct call), stop, resubmit, submit what is missing; runs one at a time."""
    from hpctrain.cli.common import open_site

    cfg, ledger, client = open_site(site)
    with ledger:
        _tick(cfg, ledger, client, list(sweeps) or None)


@sweep.command()
@site_option
@every_option
@log_option
def cron(site: str | None, every: int, log: Path) -> None:
    """Print the crontab line that ticks every active sweep with this installation of hpctrain: its interpreter,
    run in this directory (where sweep specs' relative paths resolve, as for `sweep start`) with this shell's
    PATH, Slurm configuration and hpctrain settings. Add it with `crontab -e`."""
    from hpctrain.sweep.cron import crontab_line

    click.echo(crontab_line(every, Path.cwd(), log, site, _tick_environment(site)))


@sweep.command(name="install-tick")
@click.option(
    "--crontab", "table", flag_value="crontab", help="this login node's crontab (the default where it has one)"
)
@click.option(
    "--scrontab", "table", flag_value="scrontab", help="Slurm's scrontab: the tick runs as a job on a compute node"
)
@site_option
@every_option
@log_option
@click.option(
    "--scron-option",
    "scron_options",
    multiple=True,
    metavar="--NAME[=VALUE]",
    help="an sbatch option for the tick's job under scrontab (e.g. --scron-option=--partition=cpu); repeatable",
)
@click.option("--remove", is_flag=True, help="take the tick's entry out of the table instead")
@click.option("--dry-run", is_flag=True, help="print the table as it would be written; change nothing")
def install_tick(
    table: str | None,
    site: str | None,
    every: int,
    log: Path,
    scron_options: tuple[str, ...],
    remove: bool,
    dry_run: bool,
) -> None:
    """Write the entry that ticks every active sweep (the command of `hpctrain sweep cron`) into the user's crontab
    or scrontab, between marker lines: run again, it replaces its entry; every other line stays. Ticks from both
    tables, and from several login nodes, take turns on the lock beside the ledger: each trial is submitted once."""
    from hpctrain.sweep import install
    from hpctrain.sweep.cron import crontab_line, scrontab_entry

    chosen = table or install.default_table()
    if scron_options and chosen != "scrontab":
        raise click.UsageError("--scron-option is for the tick's job under --scrontab")
    entry = None
    if not remove:
        env = _tick_environment(site)
        if chosen == "scrontab":
            entry = scrontab_entry(every, Path.cwd(), log, site, env, scron_options)
        else:
            entry = crontab_line(every, Path.cwd(), log, site, env)
    done = install.change(chosen, entry, dry_run=dry_run)  # type: ignore[arg-type]
    if dry_run:
        click.echo(f"# {chosen} as it would be written (nothing changed):")
        click.echo(done.after.encode(errors="surrogateescape"), nl=False)  # the user's lines byte for byte
    elif done.before == done.after:
        click.echo(f"{chosen}: already {'without' if remove else 'with'} this tick entry; nothing changed")
    elif remove:
        click.echo(f"{chosen}: the sweep tick's entry taken out")
    else:
        where = "as a Slurm job on a compute node" if chosen == "scrontab" else "on this host"
        click.echo(
            visible(f"{chosen}: every active sweep ticks every {every} min {where}; log: {log.expanduser().absolute()}")
        )


def _tick_environment(site: str | None) -> dict[str, str]:
    """What a tick run from cron or scrontab needs of this shell's environment, once the site config loads here (one
    that does not would fail every tick)."""
    import os

    from hpctrain.config import load_site
    from hpctrain.config.loading import expanded_variables
    from hpctrain.sweep.cron import carried

    with expanded_variables() as names:
        load_site(site)
    return carried(os.environ, names)


def _tick(cfg, ledger, client, sweep_ids: list[str] | None) -> None:
    from hpctrain.sweep.tick import tick_all, tick_lock

    with tick_lock(ledger.path):
        results = tick_all(
            ledger,
            client,
            cfg,
            sweep_ids,
            on_warning=lambda w: click.echo(visible(f"hpctrain: warning: {w}"), err=True),
        )
    for r in results:
        if r.error is not None:
            click.echo(
                visible(f"hpctrain: error: sweep {r.sweep}: {r.error}; marked FAILED, later ticks leave it out"),
                err=True,
            )
            continue
        parts = [
            f"{len(r.submitted)} submitted",
            f"{len(r.resubmitted)} resubmitted",
            f"{len(r.stopped)} stopped early",
        ]
        click.echo(visible(f"sweep {r.sweep}: {', '.join(parts)}; {r.state}"))
        if r.capped:
            click.echo(visible(f"  {r.capped}"))
        for number, why in r.stopped.items():
            click.echo(visible(f"  trial {number}: {why}"))
    if any(r.error is not None for r in results):
        sys.exit(1)  # cron reports it; the other sweeps have ticked


@sweep.command()
@click.argument("sweep_id", metavar="SWEEP")
@site_option
@click.option("--json", "as_json", is_flag=True)
def status(sweep_id: str, site: str | None, as_json: bool) -> None:
    """Trials of SWEEP (parameters, state, metric, GPU-hours) and the best one, from the ledger."""
    from rich.table import Table

    from hpctrain.cli.common import open_site
    from hpctrain.sweep import store

    _, ledger, _ = open_site(site)
    with ledger:
        swp = store.load(ledger, sweep_id)
        rows = store.trial_table(ledger, swp)
    top = store.best(rows, swp.spec.direction)
    if as_json:
        click.echo(json_text({"sweep": swp.id, "state": swp.state, "trials": rows, "best": top}))
        return
    table = Table(
        title=f"sweep {swp.id} ({swp.spec.method}, {swp.state}): {swp.spec.direction} {swp.spec.metric}",
        title_justify="left",
    )
    for col in ("trial", "params", "state", swp.spec.metric, "GPU-h", "slurm id", "note"):
        table.add_column(col)
    for r in rows:
        slurm = f"{r['slurm_job_id']}_{r['task_index']}" if r["slurm_job_id"] else "-"
        table.add_row(
            str(r["number"]),
            json.dumps(r["params"], sort_keys=True),
            r["state"],
            "-" if r["value"] is None else f"{r['value']:.6g}",
            f"{r['gpu_hours']:.2f}",
            slurm,
            r["reason"] or (f"{r['failures']} failure(s)" if r["failures"] else ""),
        )
    console = make_console()
    console.print(table)
    console.print(
        f"best: trial {top['number']} {swp.spec.metric}={top['value']:.6g} {json.dumps(top['params'])}"
        if top
        else f"best: {store.no_best(rows, swp.spec.metric)}"
    )


@sweep.command()
@click.argument("sweep_id", metavar="SWEEP")
@site_option
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="directory for the PNG files (default: ./sweep-<SWEEP>)",
)
def report(sweep_id: str, site: str | None, out_dir: str | None) -> None:
    """Write PNG plots of SWEEP: metric by trial with the best so far, and parameter importance (or say why not)."""
    require("matplotlib", "optuna")
    from hpctrain.cli.common import open_site
    from hpctrain.report.sweep_plots import write_report
    from hpctrain.sweep import store

    _, ledger, _ = open_site(site)
    with ledger:
        swp = store.load(ledger, sweep_id)
        rows = store.trial_table(ledger, swp)
    for path, why_not in write_report(swp.spec, rows, Path(out_dir or f"sweep-{swp.id}")):
        click.echo(visible(f"{path} not written: {why_not}" if why_not else f"wrote {path}"))
