"""The running Slurm's release, and the behaviour of Slurm that differs between the releases hpctrain
supports (22.05 to 26.05) and that hpctrain acts on: decided by the release, never guessed from symptoms.

Measured on the dev cluster: a preempted job whose batch script exits during its QOS grace time is left
COMPLETED by 22.05 but requeued by Slurm itself on 24.11 and 26.05; on 24.11 a job that requeues itself
during the grace gets a third run (Slurm requeues the second one again).
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
    def parse(cls, text: str) -> "SlurmVersion":
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
    def requeues_preempted_exit(self) -> bool:
        """Whether Slurm requeues a preempted job that ends by itself during its grace time."""
        return self.at_least(24, 11)

    def preemption_note(self) -> str:
        """How a preempted job comes back on this release."""
        if self.requeues_preempted_exit:
            return "a preempted job is requeued by Slurm when it exits (hpctrain leaves it to Slurm)"
        return "a preempted job that exits during its grace time is not requeued by Slurm (hpctrain requeues it)"
