"""Where the project's data directories are: ``sbatch_templates/``, ``site_configs/`` and ``scripts/examples/``
in the repository (a source tree or an editable install), else the copies a wheel carries in ``hpctrain/_bundled/``
(see setup.py)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
EXAMPLES = "scripts/examples"  # the specs' relative paths and the README name them so: copies keep the layout


def data_dir(name: str) -> Path:
    source = _PACKAGE.parent / name
    return source if source.is_dir() else _PACKAGE / "_bundled" / name
