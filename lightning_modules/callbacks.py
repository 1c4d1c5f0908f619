"""Callbacks that measure a run: training wall time (validation excluded) and target tokens/s."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn

from lightning_modules.faults import inject


class TrainingClock(pl.Callback):
    """Accumulates training time and target tokens; the totals survive checkpoint/resume."""

    def __init__(self) -> None:
        self.train_time_s = 0.0
        self.target_tokens = 0
        self._started: float | None = None

    @property
    def state_key(self) -> str:
        return "TrainingClock"

    def _start(self) -> None:
        self._started = time.perf_counter()

    def _stop(self) -> None:
        if self._started is not None:
            self.train_time_s += time.perf_counter() - self._started
            self._started = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:  # validation inside fit: training goes on
            self._start()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._stop()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._stop()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        # Every rank sees its own shard: count this rank's tokens times the number of ranks.
        self.target_tokens += int(batch["n_tokens"]) * trainer.world_size

    @property
    def tokens_per_s(self) -> float:
        return self.target_tokens / self.train_time_s if self.train_time_s > 0 else 0.0

    def state_dict(self) -> dict[str, Any]:
        running = time.perf_counter() - self._started if self._started is not None else 0.0
        return {"train_time_s": self.train_time_s + running, "target_tokens": self.target_tokens}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_time_s = float(state_dict.get("train_time_s", 0.0))
        self.target_tokens = int(state_dict.get("target_tokens", 0))


class FaultPoints(pl.Callback):
    """Calls `faults.inject` at the training and validation points it names (tests only)."""

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        inject("train_step", trainer.global_step)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        inject("validation", trainer.global_step)


class NonFiniteLoss(Exception):
    """The training loss became NaN or infinite."""


class DivergenceGuard(pl.Callback):
    """Stops training when the loss is NaN or infinite, checked every `every` steps.

    Checking reads the loss on the host, a device sync: every few steps is enough, since a
    non-finite loss poisons the weights and every later loss.
    """

    def __init__(self, every: int = 10) -> None:
        self.every = max(1, every)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every and step != trainer.max_steps:
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        finite = loss is None or bool(torch.isfinite(loss.detach()).all())
        # Every rank stops together (a rank alone raising would leave the others waiting).
        if not trainer.strategy.reduce_boolean_decision(finite, all=True):
            value = "nan" if loss is None or torch.isnan(loss.detach()).any() else "infinite"
            raise NonFiniteLoss(f"the training loss became {value} (detected at step {step})")
