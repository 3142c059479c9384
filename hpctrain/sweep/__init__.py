"""Hyperparameter sweeps, the Slurm-free core: the sweep spec, suggesting trials, early-stopping decisions.

Importing this package stays cheap: optuna is imported only when Bayesian search runs.
"""
