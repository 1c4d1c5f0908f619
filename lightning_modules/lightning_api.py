"""The one place where training goes beyond Lightning's public API, and why (checked in Lightning
2.6; pyproject.toml bounds it to `lightning>=2.6,<2.7`).

1. A checkpoint written inside a step (Ctrl-C in its forward or backward pass, a stop while it
   compiles) restores two private counts one ahead (`_TrainingEpochLoop.reset`):
   `_batches_that_stepped`, by which Lightning labels and schedules logged values (each window then
   written up to a window late, one per epoch dropped), and `batch_progress.total`, by which an
   integer `val_check_interval` validates (every later dev evaluation a step early), as seen in the
   converged `cpu` table (its results page). `align_step_counts` sets both back at the first batch
   after a restore (one optimizer, automatic optimization).
2. A checkpoint written after an epoch's last step skips the next epoch either way: written inside
   `on_train_batch_end` (`ModelCheckpoint`, SLURM's requeue), Lightning ends that epoch on restoring
   and starts the next on the first pass it draws; written after it (a stop between steps), the old
   epoch's batch count stays, so the next epoch stops after one batch. The loader saves such a
   position as the next epoch's start (`resume.ResumableLoader`) and `start_epoch_after_restore`
   zeroes the stale count.

`tests/test_reproducibility.py` resumes from each kind of checkpoint and fails if the logged rows or
dev evaluations differ from an uninterrupted run's, so a Lightning upgrade that changes this shows.
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
