"""A Python without hpctrain: a venv that sees this one's libraries (torch, tensorstore, ...) but not hpctrain."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path


def without_hpctrain(folder: Path) -> Path:
    """The interpreter of a new venv in ``folder`` with this venv's libraries on its path and hpctrain's own (an
    editable install's .pth there) not; checks that it cannot import hpctrain."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "libraries.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    isolated = subprocess.run([python, "-c", "import hpctrain"], capture_output=True, text=True, cwd=folder)
    assert "No module named 'hpctrain'" in isolated.stderr
    return python
