"""Slurm access layer: command runner, parsers."""

from hpctrain.slurm.client import SlurmClient

CONF_ENV = "SLURM_CONF"  # where Slurm's commands find slurm.conf (else their compiled-in default)

__all__ = ["CONF_ENV", "SlurmClient"]
