"""Optuna and Weights & Biases sweeps over `ablate train` configurations (see issue: sweeps)."""
