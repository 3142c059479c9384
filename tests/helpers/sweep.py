"""Sweep specs of the cluster tests: trials of scripts/examples/sweep_trial.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hpctrain.sweep import install

from helpers.paths import REPO

TRIAL = REPO / "scripts" / "examples" / "sweep_trial.py"


def sweep_spec(tmp_path: Path, name: str, extra: str, steps: int = 3, step_s: float = 0.1,
               stop_file: Path | None = None) -> Path:
    """A sweep of sweep_trial.py; with ``stop_file``, its trials run until that file exists (at most ``steps``)."""
    path = tmp_path / f"{name}.toml"
    until = f', "--stop-file", "{stop_file}"' if stop_file else ""
    path.write_text(f'''
name = "{name}"
metric = "loss"
direction = "minimize"
{extra}

[job]
name = "{name}-trial"
command = ["{sys.executable}", "{TRIAL}", "--steps", "{steps}", "--step-s", "{step_s}"{until}]
launcher = "none"
resources = {{ mem = "100M", time = "00:05:00", account = "teama" }}
''')
    return path


@contextmanager
def kept_table(table: install.Table, missing: str) -> Iterator[None]:
    """The user's cron ``table`` given back as it was after the test (skipped, saying ``missing``, without the
    command)."""
    if shutil.which(table) is None:
        pytest.skip(missing)
    saved = install.read(table)
    yield
    if saved:
        install.write(table, saved)
    else:
        subprocess.run([table, "-r"], capture_output=True)
