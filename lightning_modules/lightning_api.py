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

2. An epoch that starts right after a restore. A checkpoint written after an epoch's last step
   restores in one of two ways. Written inside `on_train_batch_end` (`ModelCheckpoint(
   every_n_train_steps)`, SLURM's requeue), Lightning ends that epoch on restoring and starts the
   next one on the first pass it draws from the loader. Written after it (Ctrl-C or SIGTERM
   between steps: `OnExceptionCheckpoint`), Lightning starts the next epoch but keeps the old
   epoch's batch count (`fit_loop.epoch_loop.batch_progress.current`), so it stops that epoch
   after one batch. Either way the next epoch's batches were skipped (found 2026-11-23, Lightning
   2.6). The loader saves such a position as the next epoch's start (`resume.ResumableLoader`),
   and `start_epoch_after_restore` zeroes the stale count when that epoch starts.
   `tests/test_reproducibility.py` resumes from both kinds of checkpoint at an epoch's end.

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


def start_epoch_after_restore(trainer: pl.Trainer) -> None:
    """At an epoch's start: if the run was just restored with the previous epoch's batch count
    still in place, count this epoch's batches from zero (reason 2)."""
    loop = trainer.fit_loop.epoch_loop
    if loop.restarting and loop.batch_progress.current.ready >= trainer.num_training_batches:
        loop.batch_progress.reset_on_run()
