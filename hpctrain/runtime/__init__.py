"""In-job runtime: preemption/time-limit guard and self-requeue, for hpctrain's trainer and users' scripts."""

from hpctrain.runtime.guard import PreemptionGuard
from hpctrain.runtime.requeue import job_end_time, requeue_target, self_requeue

__all__ = ["PreemptionGuard", "job_end_time", "requeue_target", "self_requeue"]
