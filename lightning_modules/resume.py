"""Resuming a run where it stopped, mid-epoch: the batches and dropout masks that follow are the
ones an uninterrupted run would have had.

Lightning restores the weights, the optimizer, the schedule and the loop counters from a
checkpoint. It also restores a training DataLoader that has `state_dict`/`load_state_dict` (its
`_Stateful` protocol); a plain DataLoader would start the interrupted epoch again from its first
batch, so the resumed run would see some batches twice and others not at all.

- `ResumableLoader` is that DataLoader: its state is the epoch and how many of its batches have
  finished their step, and after `load_state_dict` its next pass over the epoch starts after them
  (`TokenBucketBatchSampler.resume_at`; the batch order is a function of seed and epoch).
- `CountBatches` keeps that count. The loader's own iterator cannot: Lightning's fetcher has drawn
  the next batch already when a checkpoint is written. Lightning runs checkpoint callbacks after
  all others, so the count includes the step being saved.
- `RandomState` puts torch's random generators (CPU and, where used, CUDA) into the checkpoint:
  dropout goes on drawing what it would have. Nothing in training draws from Python's or NumPy's
  global generators (batching has its own, seeded by epoch). A checkpoint written inside a step
  (Ctrl-C in the forward pass) holds the generators as they were when that step began, since the
  resumed run does the step again from its start.
- `StepCountsAfterResume` puts Lightning's logging step and batch count back on the optimizer
  step after such a checkpoint (`lightning_api.align_step_counts`): else every training row after
  the resume is written a window late, one per epoch is lost, and each dev evaluation runs a step
  early.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_modules.lightning_api import align_step_counts, start_epoch_after_restore


class ResumableLoader(DataLoader):
    """A training DataLoader whose position within the epoch is saved and restored by Lightning.
    Its `batch_sampler` must have `epoch` and `resume_at(epoch, batches)`."""

    consumed = 0  # batches of the current epoch whose step has finished (see CountBatches)

    def state_dict(self) -> dict[str, int]:
        epoch, batches = int(self.batch_sampler.epoch), int(self.consumed)
        if batches >= len(self.batch_sampler):  # the epoch's last batch is done: resume at the next
            epoch, batches = epoch + 1, 0       # epoch's start (`lightning_api`, reason 2)
        return {"epoch": epoch, "batches": batches}

    def load_state_dict(self, state: dict[str, int]) -> None:
        # Lightning draws the resumed epoch's iterator before it sets the samplers' epoch: set it here.
        self.batch_sampler.set_epoch(int(state["epoch"]))
        self.batch_sampler.resume_at(int(state["epoch"]), int(state["batches"]))
        self.consumed = int(state["batches"])


class CountBatches(pl.Callback):
    """Tells the training `ResumableLoader` how many batches of its epoch have finished their step."""

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        loader = trainer.train_dataloader  # (not called for an epoch resumed in its middle)
        if isinstance(loader, ResumableLoader):
            loader.consumed = 0
        start_epoch_after_restore(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        loader = trainer.train_dataloader
        if isinstance(loader, ResumableLoader):
            loader.consumed = batch_idx + 1  # batch_idx counts within the epoch, across a resume


class RandomState(pl.Callback):
    """torch's CPU and CUDA generator states, saved in every checkpoint and restored on resume;
    inside a step (between its batch's start and end), as they were when the step began."""

    def __init__(self) -> None:
        self._at_step_start: dict[str, Any] | None = None

    @staticmethod
    def _capture() -> dict[str, Any]:
        state: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["cuda"] = torch.cuda.get_rng_state_all()  # host-side copies: no device sync
        return state

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._at_step_start = self._capture()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        self._at_step_start = None  # (before ModelCheckpoint: Lightning runs checkpoint callbacks last)

    def state_dict(self) -> dict[str, Any]:
        return self._at_step_start if self._at_step_start is not None else self._capture()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        torch.set_rng_state(state_dict["cpu"])
        if "cuda" in state_dict and torch.cuda.is_available():
            cuda = state_dict["cuda"]
            if len(cuda) == torch.cuda.device_count():  # the same GPUs: else the draws differ anyway
                torch.cuda.set_rng_state_all(cuda)


class StepCountsAfterResume(pl.Callback):
    """At the first batch of a fit, Lightning's logging step and batch count are made the optimizer
    step again (`lightning_api.align_step_counts`)."""

    def __init__(self) -> None:
        self._first = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first = True

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._first:
            self._first = False
            align_step_counts(trainer)
