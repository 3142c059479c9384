"""`hpctrain where`: the placements a spec may run on, soonest first (imports only click at load)."""

from __future__ import annotations

import click

from hpctrain.cli.common import make_console, open_sites, site_option
from hpctrain.cli.output import json_text


@click.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(dir_okay=False))
@site_option
@click.option("--json", "as_json", is_flag=True, help="every candidate with its figures")
def where(spec_path: str, site: str | None, as_json: bool) -> None:
    """Where SPEC would start soonest: each partition it fits and account you have (its QOS), Slurm's estimate
    (`sbatch --test-only`, one call each, cached 30 s), the waits of your jobs alike in the ledger, and the start
    predicted from both; then what was left out and why. `submit --soonest` takes the first."""
    import getpass
    import time

    from rich.table import Table

    from hpctrain.config import load_job_spec
    from hpctrain.config.types import format_slurm_time
    from hpctrain.submit.quota import WAITS_TO_START
    from hpctrain.submit.soonest import from_now, rank_sites, refused

    spec = load_job_spec(spec_path)
    sites, ledger = open_sites(site)
    now = time.time()
    with ledger:
        ranking = rank_sites(spec, sites, getpass.getuser(), spec_path, ledger, now)
    if as_json:
        rows = [
            {
                "site": c.placement.site or sites[0][0].name,
                "partition": c.placement.partition,
                "qos": c.placement.qos,
                "account": c.placement.account,
                "start": c.start,
                "slurm_start": c.slurm_start,
                "shape": c.placement.shape,
                "chunk_s": c.placement.chunk,
                "nodes": c.nodes,
                "waits_alike_s": list(c.waits),
                "basis": c.basis,
                "quota_waits": list(c.placement.waits),
            }
            for c in ranking.candidates
        ]
        errors = ranking.errors
        click.echo(
            json_text(
                {
                    "candidates": rows,
                    "left_out": ranking.left_out,
                    "errors": None if errors is None else vars(errors),
                }
            )
        )
        return
    if not ranking.candidates:
        raise refused(ranking, spec_path)
    clusters = ", ".join(cfg.name for cfg, _ in sites)
    table = Table(title=f"where {spec.name} would start on {clusters}, soonest first", title_justify="left")
    shapes, several = spec.resources.shapes is not None, len(sites) > 1
    chunks = spec.resources.time_chunks is not None
    columns = (
        *(("site",) if several else ()),
        "partition/QOS",
        "account",
        *(("nodes",) if shapes else ()),
        *(("time limit",) if chunks else ()),
        "start",
        "Slurm",
        "basis",
    )
    for col in columns:
        table.add_column(col, justify="right" if col in ("nodes", "start", "Slurm") else "left")
    for c in ranking.candidates:
        p = c.placement
        warned = "".join(f"; {w}" for w in p.waits if not w.startswith(WAITS_TO_START))  # the basis has the rest
        shape = (str(p.shape),) if shapes else ()
        limit = (f"runs of {format_slurm_time(p.chunk)}" if p.chunk else "whole",) if chunks else ()
        cluster = (p.site or "",) if several else ()
        cells = (*cluster, f"{p.partition}/{p.qos}", p.account, *shape, *limit, from_now(c.start, now))
        cells += (from_now(c.slurm_start, now),)
        table.add_row(*cells, c.basis + warned)
    console = make_console()
    console.print(table)
    for line in ranking.left_out:
        console.print(f"left out: {line}", markup=False)
    if ranking.errors is not None:
        console.print(ranking.errors.words(), markup=False)
