"""Where a cluster test runs: on the host's Slurm always, and on a Slurm lane (scripts/slurm-lane, which sets
HPCTRAIN_LANE) where its subject may differ between releases; or, where it is the same on every release, on one
release only, wherever that runs (the host's or a lane's), to balance CI's parts. The whole CI run is CPU-bound on two cores (busy all
of its 43 minutes once), and a test costs a lane what it costs the host."""

from __future__ import annotations

import functools
import os
import subprocess

import pytest

LANE = os.environ.get("HPCTRAIN_LANE", "")


def lanes(*releases: str, why: str) -> pytest.MarkDecorator:
    """Run on the host and on the lanes of ``releases`` only (none: on the host only); ``why`` the other lanes may
    skip it."""
    return pytest.mark.skipif(bool(LANE) and LANE not in releases, reason=f"CI time, not on this lane: {why}")


@functools.cache
def slurm_release() -> str:
    """The Slurm release (major.minor) the cluster tests run against: the lane's, else the host's own."""
    if LANE:
        return LANE
    said = subprocess.run(["slurmd", "-V"], capture_output=True, text=True).stdout.split()
    return ".".join(said[1].split(".")[:2]) if len(said) > 1 else ""


def on_release(release: str, why: str) -> pytest.MarkDecorator:
    """Run against Slurm ``release`` only, the host's or a lane's: a test whose subject is the same on every
    release (``why``), run where CI has time for it."""
    return pytest.mark.skipif(slurm_release() != release, reason=f"CI time, on Slurm {release} only: {why}")
