"""The one place where training goes beyond Lightning's public API, and why.

1. Lightning labels what it hands its loggers (CSV, W&B) with the training loop's count of
   stepped batches (`fit_loop.epoch_loop._batches_that_stepped`, private), and decides on that
   count, not on `trainer.global_step`, at which batches to write the logged values. The two are
   equal in a run, and after a resume from a checkpoint written between steps. A checkpoint
   written inside a step (Ctrl-C or SIGINT in the forward or backward pass: Lightning's
   `OnExceptionCheckpoint`, the sweep worker's stop) restores the count one ahead (checked in
   Lightning 2.6, `_TrainingEpochLoop.reset`): from then on each window of
   `log_every_n_steps` steps is written up to a window late under a later step, and the window
   whose write falls after an epoch's end is dropped (one training row per epoch lost; seen in the
   `cpu` table, 2026-11-23). `align_logging_step` sets the count back to `global_step` (one
   optimizer, automatic optimization: the loop counts one stepped batch per optimizer step).
   `tests/test_reproducibility.py` resumes a run interrupted inside a step and fails if its rows
   differ from an uninterrupted run's, so a Lightning upgrade that changes this shows there.

pyproject.toml bounds Lightning to the minor version this was checked with (`lightning>=2.6,<2.7`).
"""

from __future__ import annotations

import lightning.pytorch as pl


def align_logging_step(trainer: pl.Trainer) -> bool:
    """Make Lightning's logging step the optimizer step again; True if it had drifted."""
    loop = trainer.fit_loop.epoch_loop
    if loop._batches_that_stepped == trainer.global_step:
        return False
    loop._batches_that_stepped = trainer.global_step
    return True
