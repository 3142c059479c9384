"""Compute-node launch: rendezvous from Slurm, network settings, one task per GPU via srun."""
