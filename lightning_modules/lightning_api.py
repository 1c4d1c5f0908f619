"""The one place where training goes beyond Lightning's public API, and why.

1. Lightning labels what it hands its loggers (CSV, W&B) with the training loop's count of
   stepped batches (`fit_loop.epoch_loop._batches_that_stepped`, private), and decides on that
   count, not on `trainer.global_step`, at which batches to write the logged values. The two are
   equal in a run, and after a resume from a checkpoint written between steps. A checkpoint
   written inside a step (Ctrl-C in the forward or backward pass of `ablate train`, or a stop
   while a step compiles: Lightning's `OnExceptionCheckpoint`) restores the count one ahead (checked in
   Lightning 2.6, `_TrainingEpochLoop.reset`): from then on each window of
   `log_every_n_steps` steps is written up to a window late under a later step, and the window
   whose write falls after an epoch's end is dropped (one training row per epoch lost). The same checkpoint leaves the loop's count of batches drawn across
   epochs (`batch_progress.total`, on which an integer `val_check_interval` decides when to
   validate) one ahead too: Lightning's restart puts the epoch's count back on the last completed
   batch, not the total's, so every later dev evaluation ran a step early, one more per such
   resume (both seen in the converged `cpu` table: its results page). `align_step_counts` sets both back, at the first batch after a
   restore (one optimizer, automatic optimization: the loop counts one stepped batch per
   optimizer step). `tests/test_reproducibility.py` resumes a run interrupted inside a step and
   fails if its rows or its dev evaluations differ from an uninterrupted run's, so a Lightning
   upgrade that changes this shows there.

2. An epoch that starts right after a restore. A checkpoint written after an epoch's last step
   restores in one of two ways. Written inside `on_train_batch_end` (`ModelCheckpoint(
   every_n_train_steps)`, SLURM's requeue), Lightning ends that epoch on restoring and starts the
   next one on the first pass it draws from the loader. Written after it (Ctrl-C or SIGTERM
   between steps: `OnExceptionCheckpoint`), Lightning starts the next epoch but keeps the old
   epoch's batch count (`fit_loop.epoch_loop.batch_progress.current`), so it stops that epoch
   after one batch. Either way the next epoch's batches were skipped (Lightning 2.6). The loader saves such a position as the next epoch's start (`resume.ResumableLoader`),
   and `start_epoch_after_restore` zeroes the stale count when that epoch starts.
   `tests/test_reproducibility.py` resumes from both kinds of checkpoint at an epoch's end.

pyproject.toml bounds Lightning to the minor version this was checked with (`lightning>=2.6,<2.7`).
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
