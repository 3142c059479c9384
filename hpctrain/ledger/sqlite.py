"""sqlite-utils, imported without pandas and numpy.

sqlite-utils imports both where they are installed, only to map their scalar types to column types; the ledger
stores neither, and every login-node command opens it. Where pandas is installed (mlflow pulls it in), that import
cost a ledger command 0.25-0.35 s of its start-up. They are hidden from sqlite-utils' import only: importing them
afterwards works as usual.
"""

from __future__ import annotations

import sys

_HIDDEN = ("pandas", "numpy")

_hidden = [name for name in _HIDDEN if name not in sys.modules]
for _name in _hidden:
    sys.modules[_name] = None  # type: ignore[assignment]  # import_module raises ImportError for a None entry
try:
    import sqlite_utils
finally:
    for _name in _hidden:
        if sys.modules.get(_name) is None:
            del sys.modules[_name]

__all__ = ["sqlite_utils"]
