"""hpctrain: train large models on Slurm GPU clusters."""

__version__ = "0.1.0"
