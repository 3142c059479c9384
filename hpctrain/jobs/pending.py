"""Why a job waits, in words: Slurm's pending reason as a short sentence, with the numbers of the limit
behind it where hpctrain knows them (see hpctrain.submit.quota). Every reason worded here is one that
every supported release was seen to give (tests/assets/slurm_outputs); any other is quoted as Slurm says it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hpctrain.errors import SlurmError
from hpctrain.slurm.assoc_mgr import GPU, Limit, number
from hpctrain.slurm.client import SlurmClient

# Reason -> the limit behind it (True: the association's, False: the QOS's; Slurm's name of the limit).
LIMIT_REASONS: dict[str, tuple[bool, str]] = {
    "AssocGrpGRES": (True, f"GrpTRES:{GPU}"),
    "AssocGrpGRESMinutes": (True, f"GrpTRESMins:{GPU}"),
    "AssocGrpJobsLimit": (True, "GrpJobs"),
    "AssocMaxJobsLimit": (True, "MaxJobs"),
    "AssocMaxWallDurationPerJobLimit": (True, "MaxWallPJ"),
    "AssocMaxGRESPerJob": (True, f"MaxTRESPJ:{GPU}"),
    "QOSGrpGRES": (False, f"GrpTRES:{GPU}"),
    "QOSGrpGRESMinutes": (False, f"GrpTRESMins:{GPU}"),
    "QOSGrpJobsLimit": (False, "GrpJobs"),
    "QOSMaxGRESPerUser": (False, f"MaxTRESPU:{GPU}"),
    "QOSMaxJobsPerUserLimit": (False, "MaxJobsPU"),
    "QOSMaxWallDurationPerJobLimit": (False, "MaxWallPJ"),
    "QOSMaxGRESPerJob": (False, f"MaxTRESPJ:{GPU}"),
}

SENTENCES: dict[str, str] = {
    "Priority": "other jobs of higher priority are ahead of it (fairshare, QOS, age)",
    "Resources": "it is next, waiting for nodes with the GPUs, CPUs and memory it asks to free up",
    "Dependency": "it waits for the jobs it depends on to end",
    "DependencyNeverSatisfied": "its dependency can never be met (a job it needs failed): cancel it",
    "BeginTime": "it may not start before its begin time (Slurm's delay after a requeue, or --begin)",
    "JobHeldUser": "held by its user: `scontrol release` it",
    "JobHeldAdmin": "held by an administrator",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionTimeLimit": "its time limit is above the partition's",
    "PartitionNodeLimit": "it asks more nodes than the partition allows",
    "PartitionDown": "its partition is down",
    "Reservation": "it waits for its reservation to start",
    "AssocGrpGRES": "its account's running-GPU cap is reached",
    "AssocGrpGRESMinutes": "its account's GPU-minute budget is spent",
    "AssocGrpJobsLimit": "its account's running-job cap is reached",
    "AssocMaxJobsLimit": "your running-job cap in its account is reached",
    "AssocMaxWallDurationPerJobLimit": "its time limit is above its account's per-job cap",
    "AssocMaxGRESPerJob": "it asks more GPUs than its account allows a job",
    "QOSGrpGRES": "its QOS's running-GPU cap is reached",
    "QOSGrpGRESMinutes": "its QOS's GPU-minute budget is spent",
    "QOSGrpJobsLimit": "its QOS's running-job cap is reached",
    "QOSMaxGRESPerUser": "your running-GPU cap in its QOS is reached",
    "QOSMaxJobsPerUserLimit": "your running-job cap in its QOS is reached",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above its QOS's per-job cap",
    "QOSMaxGRESPerJob": "it asks more GPUs than its QOS allows a job",
}


def reason_key(reason: str) -> str:
    """Slurm's reason without the detail some releases add after a comma ("ReqNodeNotAvail, UnavailableNodes:n3")."""
    return reason.partition(", ")[0]


def explain(
    reason: str | None, account: str | None = None, qos: str | None = None, limits: list[Limit] | None = None
) -> str | None:
    """A sentence for a pending reason (None for none; "Slurm says 'X'" for one it does not know); with ``limits``,
    the numbers of the limit it names for the job's ``account`` or ``qos``."""
    if not reason or reason == "None":
        return None
    key, _, detail = reason.partition(", ")
    if key not in SENTENCES:
        return f"Slurm says {reason!r}"
    sentence = SENTENCES[key] + (f" ({detail})" if detail else "")
    if key in LIMIT_REASONS and limits:
        on_assoc, name = LIMIT_REASONS[key]
        # The account's own limit or one above it (or the job's QOS's): the one with least left.
        held = [
            lim
            for lim in limits
            if lim.slurm_name == name and (lim.qos() is None) == on_assoc and lim.applies(account, qos)
        ]
        if held:
            lim = min(held, key=lambda lim: lim.left)
            return f"{sentence}: {lim.scope}, {_numbers(lim)}"
    return sentence


def _numbers(lim: Limit) -> str:
    if lim.how == "per job":
        return f"{number(lim.limit)} {lim.what}"
    return f"{number(lim.used)} of {number(lim.limit)} {lim.unit} {'spent' if lim.how == 'spent' else 'in use'}"


def waits(job: Mapping[str, Any]) -> bool:
    """Whether the job (a ledger row or summary) is pending, or is an array with tasks pending."""
    return job["state"] == "PENDING" or "PENDING:" in (job.get("task_states") or "")


def waiting(
    jobs: Sequence[Mapping[str, Any]], client: SlurmClient, limits: Callable[[], list[Limit]]
) -> dict[int, str]:
    """Why each job among ``jobs`` (ledger rows or summaries) that `waits` does, in words: the controller's reason
    (one squeue call, only when a job waits; an array's from its first pending task) and, when a
    reason names a limit, that limit's numbers (``limits()``, one more Slurm call)."""
    pending = {job["slurm_job_id"]: job for job in jobs if waits(job) and job.get("slurm_job_id")}
    if not pending:
        return {}
    try:
        found = client.pending_reasons(list(pending))
    except SlurmError:
        return {}
    reasons = {}
    for task_id, reason in sorted(found.items()):
        job = pending.get(task_id.split("_")[0])
        if job is not None and job["id"] not in reasons and reason not in ("", "None"):
            reasons[job["id"]] = (reason, job.get("account"), job.get("qos"))
    known = limits() if any(reason_key(reason) in LIMIT_REASONS for reason, _, _ in reasons.values()) else []
    return {
        job_id: text
        for job_id, (reason, account, qos) in reasons.items()
        if (text := explain(reason, account, qos, known))
    }
