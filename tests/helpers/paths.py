"""Where things are: the repository, its tests/, the tests' data (tests/assets/), a test run's shared folder and the
suite's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
ASSETS = TESTS / "assets"
SUITE_SHARED_ENV = "HPCTRAIN_TEST_SHARED"  # set by scripts/test: a folder every part of its run sees


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


def suite_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where work done once for the whole suite is kept: the folder scripts/test gives every part of its run (the
    host's pytest sessions and each lane's, which see the repository at the same path), else this run's own."""
    shared = os.environ.get(SUITE_SHARED_ENV)
    return Path(shared) if shared else run_folder(tmp_path_factory)
