"""Optuna and Weights & Biases sweeps over `ablate train` configurations (see issue: sweeps)."""

SAMPLERS = ("tpe", "grid", "random")
PRUNERS = ("median", "percentile", "hyperband", "halving", "none")
