"""Slurm access layer: command runner, parsers."""

from hpctrain.slurm.client import SlurmClient

__all__ = ["SlurmClient"]
