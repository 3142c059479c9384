"""Login-node submission: placement, rendering, arrays, sbatch."""

from hpctrain.submit.submitter import Submission, Submitter

__all__ = ["Submission", "Submitter"]
