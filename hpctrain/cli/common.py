"""What every command shares: the --site option, the extras a command needs, the console, opening a site, finding a
job, warnings."""

from __future__ import annotations

import re
from typing import Any

import click

from hpctrain.cli.output import make_console as make_console  # every command's console, from here as before
from hpctrain.contract import SITE_DIR_ENV, SITE_ENV

site_option = click.option(
    "--site",
    "-s",
    metavar="NAME|PATH",
    default=None,
    help=f"site config: a name in site_configs/ (or ${SITE_DIR_ENV}) or a file; default ${SITE_ENV} or 'dev'; "
    "several (a,b, or a site group) where the command spans clusters",
)


class MissingModules(ModuleNotFoundError):
    """Modules a command needs that this install lacks, all of them (see ``require``)."""

    def __init__(self, names: list[str]):
        super().__init__(f"no modules named {', '.join(names)}", name=names[0])
        self.names = names


def require(*modules: str) -> None:
    """Stop unless every one of ``modules`` is installed, naming all that are not (and their extras) at once."""
    from importlib.util import find_spec

    missing = [m for m in modules if find_spec(m) is None]
    if missing:
        raise MissingModules(missing)


def open_site(site: str | None) -> tuple[Any, Any, Any]:
    """The site config, its ledger and a Slurm client for it (for this module's and other CLI commands)."""
    from hpctrain.config import load_site
    from hpctrain.ledger import Ledger
    from hpctrain.slurm import SlurmClient

    cfg = load_site(site)
    return cfg, Ledger(cfg.ledger.path, mode=cfg.ledger.mode), SlurmClient.for_site(cfg)


def open_sites(site: str | None) -> tuple[list[tuple[Any, Any]], Any]:
    """``--site a,b`` (or a site group's name): each cluster's site config with a Slurm client for it, and the one
    ledger they keep (refused in one line where they keep different ones)."""
    from hpctrain.config import load_site
    from hpctrain.config.site import site_names
    from hpctrain.errors import ConfigError
    from hpctrain.ledger import Ledger
    from hpctrain.slurm import SlurmClient

    names = site_names(site)
    if len(names) == 1:
        cfg, ledger, client = open_site(names[0])
        return [(cfg, client)], ledger
    configs = [load_site(name) for name in names]
    first = configs[0]
    for cfg in configs[1:]:
        if cfg.ledger.path != first.ledger.path:
            raise ConfigError(
                f"--site {site}: {first.name} and {cfg.name} keep different ledgers ({first.ledger.path}, "
                f"{cfg.ledger.path}): the clusters of one ranking share one"
            )
    return [(cfg, SlurmClient.for_site(cfg)) for cfg in configs], Ledger(first.ledger.path, mode=first.ledger.mode)


def refresh_sites(ledger: Any, sites: list[tuple[Any, Any]]) -> int:
    """Fold each site's job states and journals into the ledger (`hpctrain.jobs.reconcile`); how many jobs changed.
    Of several sites, one whose Slurm cannot be asked is left out in one line and its jobs are shown as last seen."""
    from hpctrain.errors import SlurmError
    from hpctrain.jobs.reconcile import reconcile

    changed = 0
    for cfg, client in sites:
        try:
            changed += warn(reconcile(ledger, client, cfg.name, supervise_runs=False)).changed_jobs
        except SlurmError as exc:
            if len(sites) == 1:
                raise
            said = "; ".join(str(exc).splitlines())
            click.echo(f"hpctrain: warning: site {cfg.name} left out, its jobs as last seen: {said}", err=True)
    return changed


def find_job(ledger: Any, job: str) -> dict[str, Any]:
    from hpctrain.errors import HpctrainError

    row = ledger.jobs.get(int(job)) if re.fullmatch(r"[0-9]{1,18}", job) else None
    if row is None:
        raise HpctrainError(f"job {job!r}: no such ledger id (see `hpctrain status --all`)")
    return row


def own_site(cfg: Any, client: Any, site: str, job_id: int) -> tuple[Any, Any]:
    """The site config and Slurm client of ``site``, where ledger job ``job_id`` runs: ``cfg``'s and ``client``
    where that is ``cfg``'s site, else that site's own, loaded by name. A job is never looked up, cancelled or
    submitted again on another cluster than its own; ConfigError in one line where its site's config is not found."""
    if site == cfg.name:
        return cfg, client
    from hpctrain.config import load_site
    from hpctrain.errors import ConfigError
    from hpctrain.slurm import SlurmClient

    try:
        own = load_site(site)
    except ConfigError as exc:
        said = str(exc).splitlines()[0]
        raise ConfigError(
            f"job {job_id} runs on site {site!r}, not {cfg.name!r}: give --site its config ({said})"
        ) from None
    return own, SlurmClient.for_site(own)


def warn(result: Any) -> Any:
    """Print a refresh's warning (accounting down: states from squeue) on stderr; returns the result."""
    if result.warning:
        click.echo(f"hpctrain: warning: {result.warning}", err=True)
    return result


def quota_limits(cfg: Any, client: Any, ledger: Any) -> list[Any]:
    """The user's quota limits (hpctrain.submit.quota); none where Slurm will not tell them."""
    import getpass

    from hpctrain.errors import SlurmError
    from hpctrain.submit.quota import user_limits

    try:
        return user_limits(cfg, client, getpass.getuser(), ledger)
    except SlurmError:
        return []


def account_budgets(cfg: Any, ledger: Any) -> dict[str, Any]:
    """Each account's GPU-minute budget (GrpTRESMins on the account itself), where one is set."""
    from hpctrain.slurm import SlurmClient
    from hpctrain.slurm.assoc_mgr import GPU

    return {
        lim.account(): lim
        for lim in quota_limits(cfg, SlurmClient.for_site(cfg), ledger)
        if lim.slurm_name == f"GrpTRESMins:{GPU}" and lim.scope.startswith("account ")
    }
