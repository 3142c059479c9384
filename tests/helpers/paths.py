"""Where things are: the repository, its tests/, the tests' data (tests/assets/) and a test run's shared folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
ASSETS = TESTS / "assets"


def tests_on_path(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (else this process's environment) with tests/ first on PYTHONPATH: a child started with
    ``python -m helpers.<module>`` (or torchrun's ``-m``) imports the helpers package from any working directory."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The temporary folder of this test run that all its pytest-xdist workers share (pytest-N/, whose popen-gwK/
    are the workers' own), or this process's own without xdist: where work done once for the run is kept."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
