"""Self-contained HTML reports (PNG plots embedded) of a job, a sweep or accounts' GPU-hours.

Names load on first use: the CLI imports this package, and matplotlib only loads when a plot is drawn.
"""

from hpctrain.lazy import lazy_exports

_EXPORTS = {"job_report": "build", "sweep_report": "build", "account_report": "build", "loss_summary": "build"}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports(__name__, _EXPORTS)
