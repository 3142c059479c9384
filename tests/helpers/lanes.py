"""Where a cluster test runs: on the host's Slurm always, and on a Slurm lane (scripts/slurm-lane, which sets
HPCTRAIN_LANE) where its subject may differ between releases. The whole CI run is CPU-bound on two cores (busy all
of its 43 minutes once), and a test costs a lane what it costs the host."""

from __future__ import annotations

import os

import pytest

LANE = os.environ.get("HPCTRAIN_LANE", "")


def lanes(*releases: str, why: str) -> pytest.MarkDecorator:
    """Run on the host and on the lanes of ``releases`` only (none: on the host only); ``why`` the other lanes may
    skip it."""
    return pytest.mark.skipif(bool(LANE) and LANE not in releases, reason=f"CI time, not on this lane: {why}")
