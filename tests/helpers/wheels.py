"""hpctrain as users install it (tests/unit/project/test_packaging.py, tests/cluster/test_packaging_cluster.py; the
fixtures ``wheel``, ``resolutions`` and ``login_install`` are in tests/conftest.py): the Pythons the login node may
have, the extras and pip's resolutions of them, and `hpctrain` run from an installed venv."""

from __future__ import annotations

import email.parser
import json
import os
import runpy
import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from pathlib import Path

from packaging.utils import canonicalize_name

from helpers.paths import REPO
from helpers.waiting import wait_until

UV = Path(sys.executable).with_name("uv")
LOGIN_PYTHONS = ("3.10", "3.12", "3.13")
PYTHONS = ("3.10", "3.11", "3.12", "3.13")  # setup.cfg's classifiers
# Extras whose requirements pull torch (train pins it; accelerate and lightning depend on it). They are resolved
# with torch named as setup.cfg pins it, and only on a Python with a local torch wheel in pip's find-links:
# elsewhere pip would download the multi-GB CUDA build to read its metadata.
TORCH_EXTRAS = ("train", "hf", "lightning", "all")
PICK_PYTHON = runpy.run_path(str(REPO / "scripts" / "pick-python"))  # its TORCH and local_torch_tags()
SPEC = """\
name = "from-wheel"
command = ["python3", "-c", "print('ran from a wheel')"]
launcher = "none"
[resources]
mem = "100M"
time = "00:02:00"
"""


def interpreter(version: str) -> str | None:
    """A CPython of ``version`` on this machine: under pyenv or on PATH (where pyenv's shims may not run it)."""
    pyenv = sorted(Path("~/.pyenv/versions").expanduser().glob(f"{version}.*/bin/python{version}"))
    for candidate in [*map(str, pyenv), shutil.which(f"python{version}")]:
        if candidate and subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    return None


def claimed(extra: str, version: str) -> bool:
    """Whether docs/install.md and setup.cfg say ``extra`` installs on Python ``version`` (hpctrain's own hint too)."""
    from hpctrain.cli import EXTRA_PYTHON

    return tuple(map(int, version.split("."))) >= EXTRA_PYTHON.get(extra, (3, 10))


def metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as z:
        return email.parser.Parser().parsestr(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA")))
                                              .decode())


class Resolution:
    """One `pip install --dry-run --report` of the wheel with some extras, by one Python's own pip, known by its files
    (its report, stderr and exit status): started once (``start``), read by any process of the test run."""

    def __init__(self, python: str, wheel: Path, extras: list[str], report: Path):
        self.python, self.wheel, self.extras, self.report = python, wheel, extras, report
        self.err, self.rc = report.with_suffix(".err"), report.with_suffix(".rc")

    def start(self) -> subprocess.Popen[bytes]:
        torch = [f"torch=={PICK_PYTHON['TORCH']}"] if set(self.extras) & set(TORCH_EXTRAS) else []
        pip = [self.python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
               str(self.report), f"{self.wheel}[{','.join(self.extras)}]", *torch]
        # The exit status written last, whole (renamed into place): its file says the others are complete.
        return subprocess.Popen(["sh", "-c", '"$@" 2>"$0.err"; echo $? >"$0.tmp" && mv "$0.tmp" "$0.rc"',
                                 str(self.report.with_suffix("")), *pip])

    def result(self) -> tuple[int, str, dict[str, dict]]:
        """pip's exit status, its stderr, and what it would install by name (the report's entries)."""
        wait_until(self.rc.exists, 600, 0.2, f"pip's resolution of {self.extras} by {self.python}")
        rc = int(self.rc.read_text())
        installs = json.loads(self.report.read_text())["install"] if rc == 0 else []
        return rc, self.err.read_text(), {canonicalize_name(i["metadata"]["name"]): i for i in installs}


def venv_with(python: str, folder: Path, requirement: str) -> Path:
    """A venv of ``python`` in ``folder`` with ``requirement`` installed by uv: its bin directory. uv installs in
    about 3 s what pip takes 35 CPU-seconds for (the mlflow stack); what pip itself resolves for every extra on every
    Python is tested apart (the ``resolutions`` fixture). pip's find-links (a local torch wheel) are uv's too."""
    links = [arg for link in os.environ.get("PIP_FIND_LINKS", "").split() for arg in ("--find-links", link)]
    for cmd in ([UV, "venv", "-q", "-p", python, str(folder)],
                [UV, "pip", "install", "-q", *links, "-p", str(folder / "bin" / "python"), requirement]):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{' '.join(map(str, cmd))}: {done.stderr[-3000:]}"
    return folder / "bin"


def hpctrain(bin_dir: Path, *args: str, cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([bin_dir / "hpctrain", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})
