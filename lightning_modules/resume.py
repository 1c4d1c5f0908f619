"""Resuming a run mid-epoch on the batches and dropout masks an uninterrupted run would have had
(docs/reliability.md): the loader's position (`ResumableLoader`, counted by `CountBatches`: the
fetcher is a batch ahead), torch's generators (`RandomState`), Lightning's step counts."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_modules.lightning_api import align_step_counts, start_epoch_after_restore


class ResumableLoader(DataLoader):
    """A training DataLoader whose position in the epoch Lightning saves and restores."""

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
    """torch's generator states in every checkpoint (inside a step: as at its start), restored on resume."""

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
    """`lightning_api.align_step_counts` at the first batch of a fit."""

    def __init__(self) -> None:
        self._first = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._first = True

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if self._first:
            self._first = False
            align_step_counts(trainer)
