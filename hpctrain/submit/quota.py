"""Quotas: the association and QOS limits that apply to a user's jobs, what is in use against each, and
what they mean for one job (refused before sbatch, or warned that it will wait).

Limits and usage come from slurmctld's own accounting manager (`scontrol show assoc_mgr`, one call);
a QOS's per-user limits, which that shows only for users with jobs in it, from `sacctmgr show qos`
(cached with the user's associations). Slurm enforces an account's Grp* limits on every account below it
(root included): those of the accounts above the user's are read too (one more call per level above
root's children).
"""

from __future__ import annotations

import pwd
from dataclasses import dataclass

from hpctrain.config.site import SiteConfig
from hpctrain.ledger import Ledger
from hpctrain.slurm import assoc_mgr
from hpctrain.slurm.assoc_mgr import GPU, Limit, number
from hpctrain.slurm.client import SlurmClient
from hpctrain.submit.limits import cached, user_associations

QOS_FIELDS = "name,maxtrespu,maxjobspu,maxsubmitpu"
QOS_MAX_AGE_S = 3600

# Slurm's name -> what it limits. "running": held while jobs run; "spent": used up (minutes);
# "per job": each job alone.
ASSOC_LIMITS = {
    f"GrpTRES:{GPU}": ("running GPUs", "running"),
    f"GrpTRESMins:{GPU}": ("GPU-minutes", "spent"),
    "GrpJobs": ("running jobs", "running"),
    "GrpSubmitJobs": ("submitted jobs", "submitted"),
    "MaxJobs": ("running jobs per user", "running"),
    "MaxSubmitJobs": ("submitted jobs per user", "submitted"),
    "MaxWallPJ": ("minutes per job", "per job"),
    f"MaxTRESPJ:{GPU}": ("GPUs per job", "per job"),
}
QOS_LIMITS = {k: v for k, v in ASSOC_LIMITS.items() if k.startswith("Grp") or "PJ" in k}
QOS_USER_LIMITS = {  # sacctmgr's field -> (assoc_mgr's per-user name, what, how)
    "maxtrespu": (f"MaxTRESPU:{GPU}", "running GPUs per user", "running"),
    "maxjobspu": ("MaxJobsPU", "running jobs per user", "running"),
    "maxsubmitpu": ("MaxSubmitJobsPU", "submitted jobs per user", "submitted"),
}


def qos_user_limits(
    site: SiteConfig, ledger: Ledger | None, client: SlurmClient, fresh: bool = False
) -> list[dict[str, str]]:
    """Every QOS's per-user limits (one `sacctmgr show qos`), cached for an hour unless ``fresh``."""

    def fetch() -> list[dict[str, str]]:
        return client.sacctmgr("qos", fields=QOS_FIELDS)

    return cached(site, ledger, "qos-limits", 0 if fresh else QOS_MAX_AGE_S, fetch)


def _tres(text: str, name: str) -> float | None:
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key == name and value:
            return float(value)
    return None


def user_limits(
    site: SiteConfig,
    client: SlurmClient,
    user: str,
    ledger: Ledger | None = None,
    fresh: bool = False,
    accounts: list[str] | None = None,
) -> list[Limit]:
    """Every limit set on ``user``'s associations (or those of ``accounts``) and the QOS they allow."""
    assocs = user_associations(site, ledger, client, user, fresh)
    mine = sorted({a["account"] for a in assocs if accounts is None or a["account"] in accounts})
    qos_names = sorted({q for a in assocs if a["account"] in mine for q in a["qos"].split(",") if q})
    if not mine:
        return []
    state, qos_state = assoc_mgr.parse(client.assoc_mgr(sorted({*mine, "root"}), user, qos_names))
    parent = {rec.account: rec.parent for rec in state if not rec.user}
    while above := sorted({p for p in parent.values() if p and p not in parent}):
        more, _ = assoc_mgr.parse(client.assoc_mgr(above, user))
        state += more
        parent |= dict.fromkeys(above, "") | {rec.account: rec.parent for rec in more if not rec.user}

    def below(account: str) -> tuple[str, ...]:
        """The user's accounts at or below ``account``."""

        def chain(a: str) -> list[str]:
            return [a, *chain(parent[a])] if parent.get(a) else [a]

        return tuple(a for a in mine if account in chain(a))

    limits: list[Limit] = []
    for rec in state:
        if rec.user not in ("", user) or (rec.user and rec.account not in mine):
            continue
        scope = f"account {rec.account}" if not rec.user else f"{rec.account}/{rec.user}"
        covers = below(rec.account) if not rec.user else (rec.account,)
        if not covers:
            continue
        for name, (what, how) in ASSOC_LIMITS.items():
            value = rec.values.get(name)
            # An account's Max* limits are the defaults of its users' associations, enforced there.
            if value is None or value.limit is None or (not rec.user and name.startswith("Max")):
                continue
            limits.append(Limit(scope, what, name, value.limit, value.used or 0.0, how, covers))
    try:
        uid = str(pwd.getpwnam(user).pw_uid)  # a QOS's per-user usage is listed by uid
    except KeyError:
        uid = ""
    per_user = {q["name"]: q for q in qos_user_limits(site, ledger, client, fresh)}
    for rec in qos_state:
        for name, (what, how) in QOS_LIMITS.items():
            value = rec.values.get(name)
            if value is not None and value.limit is not None:
                limits.append(Limit(f"QOS {rec.name}", what, name, value.limit, value.used or 0.0, how))
        row, usage = per_user.get(rec.name, {}), rec.users.get(uid, {})
        for field, (name, what, how) in QOS_USER_LIMITS.items():
            text = row.get(field, "")
            cap = _tres(text, GPU) if field == "maxtrespu" else (float(text) if text else None)
            if cap is not None:
                used = usage.get(name)
                limits.append(
                    Limit(f"QOS {rec.name} per user", what, name, cap, (used.used if used else 0) or 0.0, how)
                )
    return limits


@dataclass(frozen=True)
class JobNeeds:
    """What one job asks of the limits: GPUs and minutes per job (an array task), and how many jobs."""

    gpus: int
    minutes: float
    jobs: int = 1


WAITS_TO_START = "it will wait: "  # a verdict's wait for a running limit opens so (a budget's warning does not)


def verdict(limits: list[Limit], account: str, qos: str, needs: JobNeeds) -> tuple[list[str], list[str]]:
    """(why the job can never start under ``account`` and ``qos``, which limit it will wait for): one
    sentence each, with the numbers."""
    never: list[str] = []
    waits: list[str] = []
    for lim in limits:
        if not lim.applies(account, qos):
            continue
        asked = {
            "minutes": needs.minutes,
            "GPUs": needs.gpus,
            "GPU-minutes": needs.gpus * needs.minutes,
            "jobs": needs.jobs if lim.how == "submitted" else 1,
        }[lim.unit]
        if not asked:
            continue
        if lim.how == "spent":
            if lim.used >= lim.limit or asked > lim.limit:
                never.append(
                    f"{lim.scope}'s {lim.what} budget: {number(round(lim.used))} of {number(lim.limit)} spent, "
                    f"the job may use {number(round(asked))}"
                )
            elif asked > lim.left:
                waits.append(
                    f"{lim.scope}'s {lim.what} budget has {number(round(lim.left))} left and the job may use "
                    f"{number(round(asked))}: it is stopped if the budget runs out"
                )
        elif lim.how == "submitted":
            if lim.used + asked > lim.limit:
                never.append(
                    f"{lim.scope}'s {lim.what} cap: {number(lim.used)} of {number(lim.limit)} submitted, "
                    f"{number(asked)} more asked"
                )
        elif asked > lim.limit:
            never.append(f"{lim.scope} allows {number(lim.limit)} {lim.what}; the job asks {number(asked)} {lim.unit}")
        elif lim.how == "running" and lim.used + asked > lim.limit:
            waits.append(f"{WAITS_TO_START}{lim.describe()}")
    return never, waits


def parallel_cap(limits: list[Limit], account: str, qos: str, gpus: int) -> tuple[int, str] | None:
    """How many jobs of ``gpus`` GPUs each can run at once as ``account`` in ``qos`` under the limits held
    while jobs run (their caps, not what others use now), and which limit says so; None without such limits."""
    caps = []
    for lim in limits:
        if lim.how != "running" or not lim.applies(account, qos):
            continue
        if lim.unit == "jobs":
            caps.append((int(lim.limit), f"{lim.scope}'s {lim.what} cap ({number(lim.limit)})"))
        elif gpus:
            caps.append(
                (
                    int(lim.limit // gpus),
                    f"{lim.scope}'s {lim.what} cap ({number(lim.limit)}) "
                    f"holds {int(lim.limit // gpus)} jobs of {gpus} GPUs",
                )
            )
    return min(caps, default=None)
