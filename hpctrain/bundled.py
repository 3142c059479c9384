"""Where the project's data directories are: ``sbatch_templates/``, ``site_configs/`` and ``scripts/examples/``
in the repository (a source tree or an editable install), else the copies a wheel carries in ``hpctrain/_bundled/``
(see setup.py); and a copy of the examples for users of a wheel."""

from __future__ import annotations

import shutil
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
EXAMPLES = "scripts/examples"  # the specs' relative paths and the README name them so: copies keep the layout


def data_dir(name: str) -> Path:
    source = _PACKAGE.parent / name
    return source if source.is_dir() else _PACKAGE / "_bundled" / name


def copy_examples(dest: Path) -> tuple[Path, list[Path], list[Path]]:
    """Copy the example specs and scripts into ``dest/scripts/examples``; files already there are kept.
    Returns the folder, the files written and the files kept."""
    source, target = data_dir(EXAMPLES), dest / EXAMPLES
    written, kept = [], []
    for path in sorted(source.rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        copy = target / path.relative_to(source)
        if copy.exists():
            kept.append(copy)
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, copy)
        written.append(copy)
    return target, written, kept
