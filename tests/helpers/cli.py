"""`hpctrain` as a user runs it: a fresh ``python -m hpctrain`` process."""

from __future__ import annotations

import os
import subprocess
import sys

HPCTRAIN = [sys.executable, "-m", "hpctrain"]


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `hpctrain ARGS` in a fresh process, as a user would."""
    return subprocess.run(
        [*HPCTRAIN, *args], capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
