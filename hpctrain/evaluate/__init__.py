"""Evaluation jobs on checkpoints: `hpctrain eval` submits one Slurm job per (checkpoint, evaluator) from the
login node (`submit`), and each job runs `python -m hpctrain.evaluate` (`run`): it verifies the checkpoint, runs
the evaluator (hpctrain's held-out loss for the reference GPT, `heldout`, or the user's command) and journals
the metrics, which `reconcile` keeps in the ledger by (job, task, step, evaluator)."""
