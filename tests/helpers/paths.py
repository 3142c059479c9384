"""Where things are: the repository, its tests/ and the tests' data (tests/assets/)."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
ASSETS = TESTS / "assets"


def tests_on_path(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (else this process's environment) with tests/ first on PYTHONPATH: a child started with
    ``python -m helpers.<module>`` (or torchrun's ``-m``) imports the helpers package from any working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    return env
