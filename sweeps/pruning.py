"""Lightning callback that reports dev perplexity to an Optuna trial, keyed by global step."""

from __future__ import annotations

import lightning.pytorch as pl
import optuna
from lightning.pytorch.trainer.states import TrainerFn

MONITOR = "val/ppl"


class StepPruningCallback(pl.Callback):
    """After each validation during fit: `trial.report(val/ppl, global_step)`, then prune if asked.

    Pruning raises `optuna.TrialPruned` out of `trainer.fit` (Lightning saves an interrupted
    checkpoint on the way out); the trial process turns it into its "pruned" exit status.
    """

    def __init__(self, trial: optuna.Trial, monitor: str = MONITOR, prune: bool = True) -> None:
        self.trial, self.monitor, self.prune = trial, monitor, prune

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING or not trainer.is_global_zero:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None:
            return
        step = trainer.global_step
        self.trial.report(float(value), step)
        if self.prune and self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} ({self.monitor} {float(value):.3f})")
