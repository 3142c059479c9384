"""Slurm's job state vocabulary, as hpctrain reads it: which states are final, which come back, why a run ended.

The one place these sets live; the poller, reconcile, the in-job requeue, sweeps and the CLI import them.
"""

from __future__ import annotations

# States a job (or array task) does not leave by itself; SUBMIT_FAILED and LOST are hpctrain's own.
TERMINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "REVOKED",
        "SUBMIT_FAILED",
        "LOST",
    }
)

# A run that ended like this is requeued by Slurm when the job allows requeue; the next run's
# record may not be in slurmdbd yet, so the job is not finished.
REQUEUE_STATES = frozenset({"PREEMPTED", "NODE_FAIL", "REQUEUED"})

# After these a job runs no more. One that died (DIED) may still be run again by reconcile.
NO_MORE_RUNS = frozenset({"COMPLETED", "CANCELLED", "REVOKED", "SUBMIT_FAILED", "LOST"})

# Final states in which Slurm does not run the job again by itself: reconcile decides on these.
DIED = ("FAILED", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "TIMEOUT", "PREEMPTED", "DEADLINE")

# Why a run ended, from the final Slurm state of its record when nothing more precise was journaled.
CAUSE_OF_STATE = {
    "COMPLETED": "completed",
    "PREEMPTED": "preemption",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "NODE_FAIL": "node_failure",
    "BOOT_FAIL": "node_failure",
    "OUT_OF_MEMORY": "oom",
    "FAILED": "error",
    "CANCELLED": "cancelled",
    "REQUEUED": "requeued",
}


def normal_state(text: str) -> str:
    """'CANCELLED by 0' -> 'CANCELLED'."""
    return text.split()[0] if text else "UNKNOWN"


def array_state(states: list[str]) -> str:
    """One state for an array job from its tasks' states."""
    if any(s == "RUNNING" for s in states):
        return "RUNNING"
    if any(s not in TERMINAL for s in states):
        return "PENDING"
    if all(s == "COMPLETED" for s in states):
        return "COMPLETED"
    return "CANCELLED" if any(s == "CANCELLED" for s in states) else "FAILED"
