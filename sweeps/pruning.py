"""Lightning callback that reports dev perplexity to an Optuna trial, keyed by global step."""

from __future__ import annotations

import lightning.pytorch as pl
import optuna
from lightning.pytorch.trainer.states import TrainerFn

from sweeps.optuna_api import RunningTrial

MONITOR = "val/ppl"


class StepPruningCallback(pl.Callback):
    """After each validation during fit: `trial.report(val/ppl, global_step)`, then prune if asked.

    Under DDP only rank 0 holds the trial (`trial=None` elsewhere) and talks to Optuna; its
    decision is broadcast so that every rank stops together. Pruning raises `optuna.TrialPruned`
    out of `trainer.fit` (Lightning saves an interrupted checkpoint on the way out); the trial
    process turns it into its "pruned" exit status. A `reference` asks the pruner (which records
    its value at each rung for the others) and trains on whatever it says (`sweeps.study.PRUNING`).
    """

    def __init__(self, trial: optuna.Trial | RunningTrial | None, monitor: str = MONITOR, prune: bool = True,
                 reference: bool = False) -> None:
        self.trial, self.monitor, self.prune, self.reference = trial, monitor, prune, reference

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        reason = None
        value = trainer.callback_metrics.get(self.monitor)
        if trainer.is_global_zero and self.trial is not None and value is not None:
            step = trainer.global_step
            self.trial.report(float(value), step)
            asked = (self.prune or self.reference) and self.trial.should_prune()
            if asked and not self.reference:
                reason = f"pruned at step {step} ({self.monitor} {float(value):.3f})"
        reason = trainer.strategy.broadcast(reason, src=0)
        if reason:
            raise optuna.TrialPruned(reason)
