"""Report metrics from a training script of your own: they reach the ledger through the job's journal."""

from __future__ import annotations

from hpctrain.ledger.journal import Journal


def log_metrics(step: int, **values: float) -> bool:
    """Journal ``values`` at ``step`` (folded in by `hpctrain reconcile`, read by sweeps' early stopping and
    `hpctrain metrics`); False, and nothing written, outside an hpctrain job."""
    journal = Journal.from_env()
    if journal is None:
        return False
    journal.write("metrics", step=step, values={k: float(v) for k, v in values.items()})
    return True
