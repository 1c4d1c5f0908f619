"""The one place where training goes beyond Lightning's public API (checked in Lightning 2.6, which
pyproject.toml bounds to `<2.7`); docs/reliability.md says what went wrong without it.

1. A checkpoint written inside a step (a stop in its forward or backward pass, or while it compiles)
   restores two private counts one ahead (`_TrainingEpochLoop.reset`): `_batches_that_stepped`, by
   which Lightning labels and schedules logged values, and `batch_progress.total`, by which an
   integer `val_check_interval` validates. `align_step_counts` sets both back at the first batch
   after a restore (one optimizer, automatic optimization).
2. A checkpoint written after an epoch's last step makes Lightning skip the next epoch's batches:
   written inside `on_train_batch_end` (`ModelCheckpoint`, SLURM's requeue), it ends that epoch on
   restoring; written after it, the old epoch's batch count stays. The loader saves the next epoch's
   start (`resume.ResumableLoader`) and `start_epoch_after_restore` zeroes the stale count.

`tests/test_reproducibility.py` resumes from each kind of checkpoint and fails if a Lightning upgrade
changes this.
"""

from __future__ import annotations

import lightning.pytorch as pl


def align_step_counts(trainer: pl.Trainer) -> bool:
    """At a batch's start (`on_train_batch_start`, this batch already counted as drawn): make
    Lightning's logging step the optimizer step, and its count of batches across epochs the
    completed batches plus this one, again (reason 1). True if either had drifted."""
    loop = trainer.fit_loop.epoch_loop
    total = loop.batch_progress.total
    drifted = loop._batches_that_stepped != trainer.global_step or total.ready != total.completed + 1
    loop._batches_that_stepped = trainer.global_step
    total.ready = total.completed + 1
    total.started = total.processed = total.completed
    return drifted


def start_epoch_after_restore(trainer: pl.Trainer) -> None:
    """At an epoch's start: if the run was just restored with the previous epoch's batch count
    still in place, count this epoch's batches from zero (reason 2)."""
    loop = trainer.fit_loop.epoch_loop
    if loop.restarting and loop.batch_progress.current.ready >= trainer.num_training_batches:
        loop.batch_progress.reset_on_run()
