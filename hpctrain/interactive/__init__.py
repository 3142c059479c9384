"""Interactive sessions (`hpctrain notebook`): JupyterLab in an allocation, submitted, tracked and costed as any job.

`spec` turns the command's flags (and a job spec, for the same environment as batch) into the session's job spec,
`start` submits it and waits, `connect` is the login side's view of a session (its address, the SSH tunnel
line, its idle time), `serve` runs on the compute node and `notice` in its kernels.
"""

from hpctrain.interactive.connect import Session, wait_ready
from hpctrain.interactive.spec import session_spec
from hpctrain.interactive.start import Started, start

__all__ = ["Session", "Started", "session_spec", "start", "wait_ready"]
