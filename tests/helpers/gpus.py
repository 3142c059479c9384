"""A node sampler's journal records of four GPUs of which only GPU 0 works, written in a moment (a clock of its own)."""

from __future__ import annotations

import time

from hpctrain.contract import UTILIZATION
from hpctrain.ledger.journal import Journal
from hpctrain.runtime.utilization import NodeSampler, Reading

GiB = 2.0**30


class FourGpus:
    """A node whose rank 0 works and whose ranks 1-3 do nothing."""

    kind, devices = "nvml", ["0", "1", "2", "3"]

    def read(self):
        return [Reading(97.0, 30 * GiB, 80 * GiB, 400.0)] + [Reading(0.0, 0.5 * GiB, 80 * GiB, 60.0)] * 3

    def close(self):
        pass


def sampled(journal: Journal, job_id: int, attempt: int, seconds: float, monkeypatch, node: str = "n1") -> None:
    """A node sampler's records of ``seconds`` of readings (every 10 s, of a clock that runs on its own)."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURMD_NODENAME", node)
    monkeypatch.setenv("HPCTRAIN_ATTEMPT_BASE", str(attempt))
    sampler = NodeSampler(FourGpus(), lambda rec: journal.write(UTILIZATION, job_id=job_id, **rec), 10, 5, 1, 10)
    start = time.time() - seconds
    for k in range(int(seconds // 10) + 1):
        sampler.sample(start + 10 * k, 10.0 if k else 0.0)
        if k % 6 == 5:
            sampler.report(final=False)
    sampler.report(final=True)
