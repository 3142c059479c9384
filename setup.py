"""setuptools reads setup.cfg; this adds one build step: a wheel carries the repository's sbatch_templates/,
site_configs/ and scripts/examples/ inside the package, in hpctrain/_bundled/ (see hpctrain/bundled.py)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

BUNDLED = ("sbatch_templates", "site_configs", "scripts/examples")


class BuildPyWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads them from the source tree
        root = Path(__file__).resolve().parent
        for name in BUNDLED:
            shutil.copytree(root / name, Path(self.build_lib) / "hpctrain" / "_bundled" / name, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))


setup(cmdclass={"build_py": BuildPyWithData})
