"""Where a job runs: partition, QOS and account (fairshare-aware for account = "auto").

Everything is checked before anything is submitted; a problem is one line naming the spec
file, the key and the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpctrain.config.job import JobSpec
from hpctrain.config.loading import format_problems
from hpctrain.config.site import SiteConfig
from hpctrain.config.types import format_slurm_time
from hpctrain.errors import ConfigError, SlurmError
from hpctrain.ledger import Ledger
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit.limits import user_associations
from hpctrain.submit.quota import JobNeeds, user_limits, verdict


@dataclass(frozen=True)
class Placement:
    partition: str
    qos: str
    account: str
    reason: str
    waits: tuple[str, ...] = ()  # the limits the job will wait for (a sentence each)
    starts: tuple[float | None, float] | None = None  # chosen by its start: the one predicted, Slurm's estimate
    shape: int | None = None  # of a spec's `resources.shapes`, the node count it was placed on
    chunk: int | None = None  # of a spec's `resources.time_chunks`, the time limit (s) it runs in, where it was one
    site: str | None = None  # the cluster, where a ranking spanned several (`soonest.rank_sites`)


@dataclass(frozen=True)
class Standing:
    """One association's fairshare standing: higher sorts first."""

    account: str
    user_fairshare: float
    account_levelfs: float
    account_normshares: float

    def key(self) -> tuple[float, float, float]:
        return (self.user_fairshare, self.account_levelfs, self.account_normshares)

    def describe(self) -> str:
        return f"{self.account} (user FairShare {self.user_fairshare:.3f}, account LevelFS {self.account_levelfs:.3g})"


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def fairshare_standings(client: SlurmClient, user: str) -> dict[str, Standing]:
    """Per account: the user's FairShare there and the account's LevelFS (from one sshare call)."""
    rows = client.sshare(user)
    accounts = {r["Account"]: r for r in rows if not r.get("User")}
    standings = {}
    for r in rows:
        if r.get("User") == user and r["Account"] in accounts:
            acct = accounts[r["Account"]]
            standings[r["Account"]] = Standing(
                r["Account"],
                _float(r.get("FairShare", "")),
                _float(acct.get("LevelFS", "")),
                _float(acct.get("NormShares", "")),
            )
    return standings


def check_resources(spec: JobSpec, site: SiteConfig, partition: str, where: Path | str) -> None:
    """Refuse requests the partition cannot hold."""
    part, r = site.partitions[partition], spec.resources
    problems = []
    if r.gpus_per_node > part.gpus_per_node:
        problems.append(
            (
                ("resources", "gpus_per_node"),
                f"{r.gpus_per_node} GPUs per node requested, partition {partition!r} has {part.gpus_per_node}",
            )
        )
    cpus = r.cpus_per_task * r.ntasks_per_node
    if cpus > part.cpus_per_node:
        problems.append(
            (
                ("resources", "cpus_per_task"),
                f"{r.ntasks_per_node} tasks x {r.cpus_per_task} CPUs = {cpus} per node requested, "
                f"partition {partition!r} has {part.cpus_per_node}",
            )
        )
    if r.mem is not None and r.mem > part.mem_per_node:
        problems.append(
            (("resources", "mem"), f"{r.mem}M per node requested, partition {partition!r} has {part.mem_per_node}M")
        )
    if part.nodes is not None and r.allocated_nodes > part.nodes:
        spares = f" ({r.nodes} and {r.spare_nodes} spare)" if r.spare_nodes else ""
        problems.append(
            (
                ("resources", "nodes"),
                f"{r.allocated_nodes} nodes requested{spares}, partition {partition!r} has {part.nodes}",
            )
        )
    time = r.time or site.defaults.time
    if part.max_time is not None and time > part.max_time:
        problems.append(
            (
                ("resources", "time"),
                f"{format_slurm_time(time)} requested, partition {partition!r} "
                f"allows {format_slurm_time(part.max_time)}",
            )
        )
    if problems:
        raise ConfigError(format_problems(where, problems))


def _allowed_accounts(rows: list[dict[str, str]], partition: str, qos: str) -> dict[str, bool]:
    """Each account of the user's associations: whether one of them allows ``qos`` on ``partition``."""
    allowed: dict[str, bool] = {}
    for row in rows:
        ok_partition = row["partition"] in ("", partition)
        ok_qos = qos in row["qos"].split(",")
        allowed[row["account"]] = allowed.get(row["account"], False) or (ok_partition and ok_qos)
    return allowed


def choose_placement(
    spec: JobSpec, site: SiteConfig, client: SlurmClient, user: str, where: Path | str, ledger: Ledger | None = None
) -> Placement:
    """Pick and validate partition, QOS and account; account "auto" goes to the best fairshare standing.
    With a ledger, the user's associations come from its cache (read again before refusing)."""
    r, d = spec.resources, site.defaults

    def refuse(loc: tuple[str, ...], msg: str) -> ConfigError:
        return ConfigError(format_problems(where, [(loc, msg)]))

    partition = r.partition or d.partition
    if partition not in site.partitions:
        raise refuse(
            ("resources", "partition"),
            f"partition {partition!r} is not in site {site.name!r} (has: {', '.join(sorted(site.partitions))})",
        )
    check_resources(spec, site, partition, where)

    if r.qos:
        qos = r.qos
    elif r.preemptible is True:
        if d.preemptible_qos is None:
            raise refuse(
                ("resources", "preemptible"), f"site {site.name!r} has no preemptible QOS (defaults.preemptible_qos)"
            )
        qos = d.preemptible_qos
    else:
        qos = d.qos
    if qos not in site.qos:
        raise refuse(
            ("resources", "qos"), f"QOS {qos!r} is not in site {site.name!r} (has: {', '.join(sorted(site.qos))})"
        )

    def limits_verdicts(accounts: list[str]) -> dict[str, tuple[list[str], list[str]]]:
        """Per account: (why the job can never start there, what it will wait for). Limits that block it are
        read again before anything is refused; where Slurm will not show limits, sbatch decides."""
        verdicts: dict[str, tuple[list[str], list[str]]] = {}
        for fresh in (False, True):
            try:
                limits = user_limits(site, client, user, ledger, fresh=fresh, accounts=accounts)
            except SlurmError:
                return {}
            verdicts = {a: verdict(limits, a, qos, needs) for a in accounts}
            if ledger is None or not any(never for never, _ in verdicts.values()):
                break
        return verdicts

    needs = JobNeeds(r.allocated_gpus, (r.time or d.time) / 60, len(spec.array.parameter_sets()) if spec.array else 1)
    account = r.account or d.account
    allowed = _allowed_accounts(user_associations(site, ledger, client, user), partition, qos)
    if ledger is not None and not (allowed.get(account) if account != "auto" else any(allowed.values())):
        allowed = _allowed_accounts(user_associations(site, ledger, client, user, fresh=True), partition, qos)
    if account != "auto":
        if account not in allowed:
            raise refuse(
                ("resources", "account"),
                f"user {user!r} has no association with account {account!r} "
                f"(has: {', '.join(sorted(allowed)) or 'none'})",
            )
        if not allowed[account]:
            raise refuse(
                ("resources", "qos"), f"QOS {qos!r} on partition {partition!r} is not allowed for account {account!r}"
            )
        never, waits = limits_verdicts([account]).get(account, ([], []))
        if never:
            raise refuse(("resources", "account"), f"the job can never start as {account!r}: {'; '.join(never)}")
        return Placement(
            partition, qos, account, f"account {account!r} named by the {'spec' if r.account else 'site'}", tuple(waits)
        )

    candidates = sorted(a for a, ok in allowed.items() if ok and a in site.accounts)
    if not candidates:
        raise refuse(
            ("resources", "account"),
            f"no account of user {user!r} in site {site.name!r} allows QOS {qos!r} on partition {partition!r}",
        )
    verdicts = limits_verdicts(candidates)
    blocked = {a: verdicts[a][0] for a in candidates if a in verdicts and verdicts[a][0]}
    if len(blocked) == len(candidates):
        raise refuse(
            ("resources", "account"),
            "the job can never start in any account: "
            + "; ".join(f"{a}: {', '.join(why)}" for a, why in blocked.items()),
        )
    standings = fairshare_standings(client, user)
    ranked = sorted(
        (standings.get(a, Standing(a, 0.0, 0.0, 0.0)) for a in candidates if a not in blocked),
        key=Standing.key,
        reverse=True,
    )
    best = ranked[0]
    others = "; ".join(s.describe() for s in ranked[1:]) or "no other candidate"
    left_out = "".join(f"; left out {a}: {', '.join(why)}" for a, why in blocked.items())
    return Placement(
        partition,
        qos,
        best.account,
        f"auto: best fairshare {best.describe()} over {others}{left_out}",
        tuple(verdicts.get(best.account, ([], []))[1]),
    )
