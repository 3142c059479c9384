"""In-job runtime: preemption/time-limit guard, self-requeue and attempt bookkeeping, for hpctrain's
trainer and users' own scripts. Names load on first use (the CLI imports this package)."""

from hpctrain.lazy import lazy_exports

_EXPORTS = {
    "PreemptionGuard": "guard",
    "JobNow": "guard",
    "job_now": "requeue",
    "self_requeue": "requeue",
    "log_metrics": "metrics",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
