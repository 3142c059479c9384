"""`hpctrain cache ls|verify|clear`: the node-local shard cache (hpctrain.data.cache) on this host, or with --node on a
compute node, as a one-task job step there. Imports only click at load."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from hpctrain.cli.common import site_option
from hpctrain.cli.output import json_text

ON_NODE_MINUTES = 10  # a job step on the node: the most an ls, verify or clear may take there

node_option = click.option(
    "--node", default=None, help="a compute node: run there, as a one-task job step (srun); default: this host"
)
json_option = click.option("--json", "as_json", is_flag=True)


@click.group()
def cache() -> None:
    """The node-local cache of shards (site [cache]): what it holds, each copy hashed again, cleared."""


def _action(name: str) -> Callable[[Callable[[dict[str, Any]], None]], click.Command]:
    """`hpctrain cache NAME [--site S] [--node N] [--json]`: the answer as JSON, or as the decorated function says it
    (its docstring the command's help)."""

    def command(say: Callable[[dict[str, Any]], None]) -> click.Command:
        @cache.command(name, help=say.__doc__)
        @site_option
        @node_option
        @json_option
        def run(site: str | None, node: str | None, as_json: bool) -> None:
            found = _run(site, node, name)
            if as_json:
                click.echo(json_text(found))
            else:
                say(found)

        return run

    return command


@_action("ls")
def _ls(found: dict[str, Any]) -> None:
    """The copies in the cache, most recently used first: sha256, size, last use, verified, in use."""
    from datetime import datetime

    copies = found["copies"]
    click.echo(
        f"{found['dir']} on {found['host']}: {len(copies)} copies, {sum(c['bytes'] for c in copies) / 1e6:.0f} MB"
    )
    for c in copies:
        flags = ", ".join(f for f, on in (("verified", c["verified"]), ("in use", c["in_use"])) if on)
        when = datetime.fromtimestamp(c["last_used"]).isoformat(" ", "seconds") if c["last_used"] else "never"
        click.echo(f"  {c['sha256'][:16]}  {c['bytes'] / 1e6:9.1f} MB  last used {when}  {flags}")


@_action("verify")
def _verify(found: dict[str, Any]) -> None:
    """Hash every copy again (its name is its sha256); a copy that does not match is removed, and fetched again by
    the next reader (exit 1)."""
    click.echo(
        f"{found['dir']} on {found['host']}: {found['verified']} copies verified, {found['corrupt']} corrupt (removed)"
    )
    if found["corrupt"]:
        sys.exit(1)


@_action("clear")
def _clear(found: dict[str, Any]) -> None:
    """Remove every copy no process reads or fetches now."""
    click.echo(
        f"{found['dir']} on {found['host']}: {found['removed']} copies removed "
        f"({found['bytes'] / 1e6:.0f} MB), {found['in_use']} in use kept"
    )


def _run(site: str | None, node: str | None, action: str) -> dict[str, Any]:
    """``action`` on this host's cache, or on ``node``'s (this command, run there with --json)."""
    from hpctrain.config import load_site
    from hpctrain.errors import HpctrainError

    cfg = load_site(site)
    if node is None:
        from hpctrain.data.cache import CacheFallback, site_cache

        try:
            shards = site_cache(cfg)
        except CacheFallback as exc:
            raise HpctrainError(f"{exc}: give --node NODE to look on a compute node") from None
        if shards is None:
            raise HpctrainError(f"site {cfg.name} has no [cache] dir")
        from hpctrain.data.cache_admin import act

        return act(shards, action)
    from hpctrain.slurm import SlurmClient

    client = SlurmClient.for_site(cfg)
    client.timeout_s = max(client.timeout_s, ON_NODE_MINUTES * 60 + 120)
    python = str(cfg.launch.python or sys.executable)
    out = client.on_node(
        node,
        cfg.defaults.partition,
        [python, "-m", "hpctrain", "cache", action, "--site", cfg.ref, "--json"],
        minutes=ON_NODE_MINUTES,
    )
    try:
        found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise HpctrainError(
            f"cache {action} on {node}: no answer ({out.strip()[-300:] or 'nothing printed'})"
        ) from None
    return found
