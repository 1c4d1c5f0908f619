"""The one place where training goes beyond Lightning's public API (Lightning 2.6, bounded to `<2.7`);
docs/reliability.md says what went wrong without it, `tests/test_reproducibility.py` if it changes.

1. A checkpoint written inside a step restores two private counts one ahead
   (`_TrainingEpochLoop.reset`): `_batches_that_stepped`, by which Lightning labels and schedules
   logged values, and `batch_progress.total`, by which an integer `val_check_interval` validates:
   `align_step_counts` sets both back at the first batch after a restore.
2. A checkpoint written after an epoch's last step makes Lightning skip the next epoch (written inside
   `on_train_batch_end` it ends the epoch on restoring; after it, the old batch count stays): the
   loader saves the next epoch's start (`resume.ResumableLoader`), `start_epoch_after_restore` the rest."""

from __future__ import annotations

import lightning.pytorch as pl


def align_step_counts(trainer: pl.Trainer) -> bool:
    """At a batch's start: Lightning's logging step and batch count set to the optimizer step's (reason 1)."""
    loop = trainer.fit_loop.epoch_loop
    total = loop.batch_progress.total
    drifted = loop._batches_that_stepped != trainer.global_step or total.ready != total.completed + 1
    loop._batches_that_stepped = trainer.global_step
    total.ready = total.completed + 1
    total.started = total.processed = total.completed
    return drifted


def start_epoch_after_restore(trainer: pl.Trainer) -> None:
    """At an epoch's start just after a restore, count its batches from zero again (reason 2)."""
    loop = trainer.fit_loop.epoch_loop
    if loop.restarting and loop.batch_progress.current.ready >= trainer.num_training_batches:
        loop.batch_progress.reset_on_run()
