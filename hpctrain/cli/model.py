"""`hpctrain model ...`: the model registry (imports only click at module load)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from hpctrain.cli.common import make_console, site_option
from hpctrain.cli.output import json_text, visible
from hpctrain.cli.types import INDEX, LEDGER_ID, Finite

_ALIAS = click.option("--alias", "alias", required=True, metavar="ALIAS", help="e.g. production or staging")


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def model() -> None:
    """Name checkpoints as model versions, promote them through an evaluation gate, roll back, hand them on."""


@model.command()
@click.argument("name")
@click.argument("job", type=LEDGER_ID)
@click.option("--step", type=INDEX, default=None, help="the checkpoint of this step (default: newest)")
@click.option("--task", type=INDEX, default=None, help="of this array task (a sweep's trial)")
@click.option("--gate-evaluator", default=None, metavar="NAME", help="a new model's gate: this evaluator's results")
@click.option("--gate-metric", default=None, metavar="METRIC", help="a new model's gate: this metric (eval/loss)")
@click.option("--gate-mode", type=click.Choice(["min", "max"]), default=None, help="a new model's gate: lower/higher")
@click.option("--gate-threshold", type=Finite(), default=None, help="a new model's gate: the value to reach")
@site_option
def register(
    name: str,
    job: int,
    step: int | None,
    task: int | None,
    gate_evaluator: str | None,
    gate_metric: str | None,
    gate_mode: str | None,
    gate_threshold: float | None,
    site: str | None,
) -> None:
    """Register JOB's checkpoint as the next version of model NAME: immutable, with the job's lineage, its
    checkpoint pinned (retention keeps it for good). A new model's gate is the job spec's [eval.gate], or the
    --gate-* options."""
    from hpctrain.cli.common import open_site
    from hpctrain.config.job import GatePolicy
    from hpctrain.config.loading import validate
    from hpctrain.registry.gate import Gate
    from hpctrain.registry.versions import register_checkpoint

    given = {"evaluator": gate_evaluator, "metric": gate_metric, "mode": gate_mode, "threshold": gate_threshold}
    options = {k: v for k, v in given.items() if v is not None}
    gate = Gate.of(validate(GatePolicy, options, "--gate-* options")) if options else None
    _, ledger, _ = open_site(site)
    with ledger:
        version, created = register_checkpoint(ledger, name, job, step, task, gate)
    said = f"registered {name}:{version['version']}:" if created else f"{name}:{version['version']} is already"
    click.echo(
        visible(f"{said} job {job} step {version['step']}, {version['checkpoint']} (pinned: retention keeps it)")
    )


@model.command("ls")
@site_option
@click.option("--json", "as_json", is_flag=True)
def ls(site: str | None, as_json: bool) -> None:
    """The registered models: versions, aliases and gate."""
    from rich.table import Table

    from hpctrain.cli.common import open_site
    from hpctrain.registry.gate import Gate

    _, ledger, _ = open_site(site)
    with ledger:
        found = []
        for m in ledger.registry.models():
            versions = ledger.registry.versions(m["name"])
            aliases = {a["alias"]: a["version"] for a in ledger.registry.aliases(m["name"])}
            found.append((m, len(versions), versions[-1]["registered_at"] if versions else None, aliases))
    if as_json:
        click.echo(json_text([{**m, "versions": n, "aliases": a} for m, n, _, a in found]))
        return
    if not found:
        click.echo("no models registered yet (hpctrain model register NAME JOB)")
        return
    table = Table(title="models", title_justify="left")
    for column in ("model", "versions", "aliases", "gate", "last registered"):
        table.add_column(column)
    for m, n, last, aliases in found:
        names = ", ".join(f"{a}: {v}" for a, v in aliases.items()) or "-"
        table.add_row(m["name"], str(n), names, str(Gate.of_model(m)), _when(last) if last else "-")
    make_console().print(table)


@model.command()
@click.argument("ref", metavar="NAME[@ALIAS|:VERSION]")
@site_option
@click.option("--json", "as_json", is_flag=True)
def show(ref: str, site: str | None, as_json: bool) -> None:
    """One version (default: the newest): its checkpoint, lineage, evaluation results and aliases."""
    from hpctrain.cli.common import open_site
    from hpctrain.registry.names import parse_ref
    from hpctrain.registry.versions import aliases_of, resolve
    from hpctrain.registry.versions import results as results_of

    _, ledger, _ = open_site(site)
    with ledger:
        version = resolve(ledger, parse_ref(ref))
        lineage = json.loads(version["lineage_json"])
        results, aliases = results_of(ledger, version), aliases_of(ledger, version)
    if as_json:
        click.echo(json_text({**version, "lineage_json": lineage, "evaluations": results, "aliases": aliases}))
        return
    code, data, versions = lineage.get("code") or {}, lineage.get("data") or {}, lineage.get("versions") or {}
    lines = [
        f"{version['model']}:{version['version']}" + (f" ({', '.join(aliases)})" if aliases else ""),
        f"  checkpoint   {version['checkpoint']} (job {version['job_id']} step {version['step']}"
        + (f" task {version['task_index']}" if version["task_index"] >= 0 else "")
        + f", manifest sha256 {version['manifest_sha256'][:16]})",
        f"  registered   {_when(version['registered_at'])} by {version['registered_by']}",
        f"  code         {code.get('commit') or '-'}" + (" (dirty)" if code.get("dirty") else ""),
        f"  data         {data.get('index') or '-'}" + (f" sha256 {data['sha256'][:16]}" if data.get("sha256") else ""),
        f"  seed         {lineage.get('seed')}",
        f"  layout       {json.dumps(lineage.get('parallel'))}",
        f"  hyperparams  {json.dumps(lineage.get('hyperparameters'))}",
        f"  versions     hpctrain {versions.get('hpctrain')}, torch {versions.get('torch')}",
    ]
    for name, values in results.items():
        lines.append(f"  eval {name:<8}{json.dumps(values)}")
    click.echo(visible("\n".join(lines)))


@model.command()
@click.argument("name")
@click.argument("version", type=LEDGER_ID)
@_ALIAS
@click.option("--force", is_flag=True, help="past a refusing gate (needs --why; recorded)")
@click.option("--why", default=None, metavar="TEXT", help="the reason, kept in the history")
@site_option
def promote(name: str, version: int, alias: str, force: bool, why: str | None, site: str | None) -> None:
    """Point ALIAS of model NAME at VERSION if the gate passes: the version has the gate evaluator's result, no
    worse than the alias's current target's and within the threshold. Every move is kept (`model history`)."""
    from hpctrain.cli.common import open_site
    from hpctrain.registry.aliases import decide
    from hpctrain.registry.aliases import promote as move

    _, ledger, _ = open_site(site)
    with ledger:
        if ledger.registry.seen(name, alias)[0] == version:  # run again after its commit, or by a twin: done
            click.echo(visible(f"{name}@{alias} is version {version} already; nothing changed"))
            return
        decision = decide(ledger, name, version, alias)
        done = move(ledger, decision, why, force)
    n = decision.numbers
    click.echo(
        visible(
            f"{name}@{alias}: {_from(done['from_version'])} -> version {version} ({done['action']}; {n['metric']} "
            f"{_number(n['candidate'])} vs {_number(n['current'])})"
            + (f"; the gate refused: {decision.refusal}" if decision.refusal else "")
        )
    )


@model.command()
@click.argument("name")
@_ALIAS
@click.option("--why", default=None, metavar="TEXT", help="the reason, kept in the history")
@click.option(
    "--undo",
    "move",
    type=click.IntRange(min=1),
    default=None,
    metavar="MOVE",
    help="the promotion to undo (its move in `model history`): run again, it is not undone twice",
)
@site_option
def rollback(name: str, alias: str, why: str | None, move: int | None, site: str | None) -> None:
    """Move ALIAS of model NAME back to its target before the last promotion not yet rolled back. Not re-gated:
    that version got there through the gate, or by a forced promotion; the line says which (kept in the history).
    With --undo MOVE, only if MOVE is that promotion; run again, it says MOVE is rolled back already."""
    from hpctrain.cli.common import open_site
    from hpctrain.registry.aliases import basis, undo

    _, ledger, _ = open_site(site)
    with ledger:
        done, now = undo(ledger, name, alias, why, move)
    went = f"{_from(done['from_version'])} -> {_from(done['to_version'])}"
    if now:
        click.echo(f"{name}@{alias}: {went} (rollback; {basis(done)})")
    else:
        click.echo(f"{name}@{alias}: move {move} is rolled back already (move {done['id']}: {went})")


def _from(version: int | None) -> str:
    return "none" if version is None else f"version {version}"


@model.command()
@click.argument("name")
@click.option("--alias", default=None, metavar="ALIAS", help="this alias's moves only")
@site_option
@click.option("--json", "as_json", is_flag=True)
def history(name: str, alias: str | None, site: str | None, as_json: bool) -> None:
    """Every move of the model's aliases: when, who, what, from, to, why, and the gate's numbers."""
    from rich.table import Table

    from hpctrain.cli.common import open_site
    from hpctrain.registry.aliases import gate_numbers
    from hpctrain.registry.aliases import history as moves_of

    _, ledger, _ = open_site(site)
    with ledger:
        moves = moves_of(ledger, name, alias)
    if as_json:
        click.echo(json_text([{**m, "gate_json": gate_numbers(m)} for m in moves]))
        return
    if not moves:
        click.echo(f"no alias of {name} has moved yet (hpctrain model promote {name} VERSION --alias ALIAS)")
        return
    table = Table(title=f"alias moves of {name}", title_justify="left")
    for column in ("move", "when", "by", "alias", "action", "from", "to", "gate", "why"):
        table.add_column(column, overflow="fold")
    for m in moves:
        g = gate_numbers(m)
        numbers = f"{g['metric']} {_number(g['candidate'])} vs {_number(g['current'])}" if g else "-"
        table.add_row(
            str(m["id"]),
            _when(m["at"]),
            m["by"],
            m["alias"],
            m["action"],
            _from(m["from_version"]),
            _from(m["to_version"]),
            numbers,
            m["why"] or "-",
        )
    make_console().print(table)


@model.command()
@click.argument("ref", metavar="NAME[@ALIAS|:VERSION]")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["safetensors", "torch"]), default="safetensors", show_default=True)
@site_option
def export(ref: str, out: Path, fmt: str, site: str | None) -> None:
    """Write a version to the new folder OUT: its weights, a manifest (lineage, checksums) and, for the reference
    GPT, a model definition that loads them in plain PyTorch, without hpctrain. The weights are streamed tensor by
    tensor; the folder appears whole at the end, or not at all."""
    from hpctrain.cli.common import open_site, require
    from hpctrain.registry.export import export_version
    from hpctrain.registry.names import parse_ref
    from hpctrain.registry.versions import resolve

    require("torch", "safetensors", "tensorstore")
    _, ledger, _ = open_site(site)
    with ledger:
        version = resolve(ledger, parse_ref(ref))
        written, now = export_version(ledger, version, out, fmt)
    said = "exported" if now else "already exported"
    click.echo(visible(f"{said} {version['model']}:{version['version']} to {out}: {', '.join(written)}"))
