"""The running Slurm's release, and the behaviour of Slurm that differs between the releases hpctrain
supports (22.05 to 26.05) and that hpctrain acts on: decided by the release and the controller's
configuration, never guessed from symptoms.

Measured on the dev cluster: a preempted job whose batch script exits during its QOS grace time is left
COMPLETED by 22.05 but requeued by Slurm itself on 24.11 and 26.05; on 24.11 a job that requeues itself
during the grace gets a third run (Slurm requeues the second one again), and so does a job that Slurm
killed at the end of the grace (tests/assets/slurm_outputs: the completed second run is recorded PREEMPTED).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpctrain.errors import SlurmError


@dataclass(frozen=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmVersion:
        """From `scontrol --version` ('slurm 24.11.5'), SLURM_VERSION of `scontrol show config`, or '26.05.5'."""
        m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        if not m:
            raise SlurmError(f"cannot read a Slurm version from {text.strip()!r}")
        return cls(int(m[1]), int(m[2]), int(m[3] or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    def at_least(self, major: int, minor: int) -> bool:
        return (self.major, self.minor) >= (major, minor)

    @property
    def has_only_job_state(self) -> bool:
        """`squeue --only-job-state` (23.11+): a state-only RPC, cheaper for slurmctld than a full job list."""
        return self.at_least(23, 11)

    @property
    def has_requeue_delay(self) -> bool:
        """`SchedulerParameters=requeue_delay=` (25.11+); before, a requeued job waits AuthInfo's cred_expire."""
        return self.at_least(25, 11)

    @property
    def has_node_count_lists(self) -> bool:
        """sbatch `--nodes=2,4` (a list of node counts: 24.11 and 26.05 read it; 22.05 reads only a range)."""
        return self.at_least(24, 11)

    @property
    def requeues_preempted_exit(self) -> bool:
        """Whether Slurm requeues a preempted job that ends by itself during its grace time (where the job's QOS, or
        the cluster, preempts with REQUEUE: hpctrain.runtime.requeue.requeues_on_preemption)."""
        return self.at_least(24, 11)

    @property
    def reruns_after_preemption(self) -> bool:
        """Whether Slurm runs a job once more after a run completed it, when an earlier run was preempted and outlived
        its grace time (seen on 24.11.5; not on 22.05 or 26.05)."""
        return self.at_least(24, 11) and not self.at_least(26, 5)

    def preemption_note(self) -> str:
        """How a preempted job comes back on this release."""
        if not self.requeues_preempted_exit:
            return "a preempted job that exits during its grace time is not requeued by Slurm (hpctrain requeues it)"
        note = "a preempted job is requeued by Slurm when it exits (hpctrain leaves it to Slurm)"
        if self.reruns_after_preemption:
            note += (
                "; a job whose command ignored the notice and was killed after its grace time is run once more by "
                "Slurm after its next run completes: hpctrain's batch script ends that run at once (cause rerun)"
            )
        return note


@dataclass(frozen=True)
class SlurmFeatures:
    """What hpctrain uses of the running controller, from one `scontrol show config`."""

    version: SlurmVersion
    requeue_delay_s: int
    requeue_delay_from: str
    preempt_mode: str = ""  # the cluster's PreemptMode (a QOS whose own is "cluster" follows it)

    @classmethod
    def from_config(cls, conf: dict[str, str]) -> SlurmFeatures:
        version = SlurmVersion.parse(conf.get("SLURM_VERSION", ""))
        cred_expire = _option(conf.get("AuthInfo", ""), "cred_expire")
        delay, source = 120 if cred_expire is None else cred_expire, "AuthInfo cred_expire"
        if (
            version.has_requeue_delay
            and (own := _option(conf.get("SchedulerParameters", ""), "requeue_delay")) is not None
        ):
            delay, source = own, "SchedulerParameters requeue_delay"
        return cls(version, delay, source, conf.get("PreemptMode", ""))

    def notes(self) -> list[str]:
        """One phrase per version-dependent behaviour, for `doctor`."""
        return [
            self.version.preemption_note(),
            f"a requeued job waits {self.requeue_delay_s} s before it may start ({self.requeue_delay_from})",
            "state polls while accounting is down use squeue --only-job-state"
            if self.version.has_only_job_state
            else "state polls while accounting is down use a full squeue listing (--only-job-state is 23.11+)",
        ]


def _option(value: str, key: str) -> int | None:
    """``key``'s integer in a comma-separated Slurm option list ('socket=/x,cred_expire=10')."""
    for item in value.split(","):
        name, _, number = item.strip().partition("=")
        if name == key and number.isdigit():
            return int(number)
    return None
