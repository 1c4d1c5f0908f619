"""Callbacks of a run: what it measures, fault points, and how it stops (at a step's end, every rank
together, or at once while compiling)."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from torch import Tensor

from foundation.faults import armed, inject
from foundation.stop import REQUEUE_SIGNAL, StopRequest
from lightning_modules.stopwatch import StartUp, Stopwatch


class TrainingClock(pl.Callback):
    """Training time and target tokens across resumes, start-up, first step and steady rate."""

    def __init__(self, every: int = 50, startup: StartUp | None = None) -> None:
        self.training = Stopwatch()  # validation inside fit and stretches stopped left out
        self.startup = startup or StartUp()  # its last part ends at the first training step
        self.target_tokens = 0
        self.every = max(1, every)
        self.startup_s: float | None = None
        self.first_step_s: float | None = None
        self._first_started: float | None = None
        self._marks: list[tuple[float, int]] = []  # (training seconds, tokens) at window boundaries
        self._lapped = 0.0  # the training seconds at the previous lap

    @property
    def train_time_s(self) -> float:
        return self.training.seconds

    @staticmethod
    def of(trainer: pl.Trainer) -> TrainingClock | None:
        """The trainer's clock, if it has one."""
        return next((c for c in trainer.callbacks if isinstance(c, TrainingClock)), None)

    def lap(self) -> float:
        """Seconds of training since the previous lap (or since training started in this process)."""
        total = self.training.total
        seconds, self._lapped = total - self._lapped, total
        return seconds

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._lapped = self.training.seconds  # restored from a checkpoint, if resumed
        self.training.start()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.training.stop()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:  # validation inside fit: training goes on
            self.training.start()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.training.stop()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self.training.stop()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.startup_s is None:
            self.startup_s = self.startup.mark("fit")  # fit's set-up: device, optimizer, checkpoint, the first batch
            self._first_started = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        # this rank's shard times the ranks; `n_tokens` is a host-side int: no wait for the GPU
        self.target_tokens += int(batch["n_tokens"]) * trainer.world_size
        first = self.first_step_s is None and self._first_started is not None
        mark = trainer.global_step % self.every == 0
        if (first or mark) and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)  # once per window: the device's real time
        if first:
            self.first_step_s = time.perf_counter() - self._first_started
        if mark:
            self._marks.append((self.training.total, self.target_tokens))

    @property
    def tokens_per_s(self) -> float:
        return self.target_tokens / self.train_time_s if self.train_time_s > 0 else 0.0

    @property
    def steady_tokens_per_s(self) -> float | None:
        """Target tokens/s from the second window boundary of this process to the last."""
        marks = self._marks[1:]
        if len(marks) < 2 or marks[-1][0] <= marks[0][0]:
            return None
        return (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])

    def state_dict(self) -> dict[str, Any]:
        return {"train_time_s": self.training.total, "target_tokens": self.target_tokens}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.training.seconds = float(state_dict.get("train_time_s", 0.0))
        self.target_tokens = int(state_dict.get("target_tokens", 0))


class FaultPoints(pl.Callback):
    """The training and validation points of `foundation.faults` (tests only; nothing when unset)."""

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule, loss: Tensor) -> None:
        inject("train_forward", trainer.global_step + 1)  # between a step's forward and its backward

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if armed("nan_grad", trainer.global_step + 1):
            for parameter in pl_module.parameters():
                if parameter.grad is not None:
                    parameter.grad.fill_(float("nan"))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        inject("train_step", trainer.global_step)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        inject("validation", trainer.global_step)


class NonFiniteLoss(Exception):
    """The training loss became NaN or infinite."""


class PromptInterruptWhileCompiling(pl.Callback):
    """A stop while a step compiles stops the run at once (docs/reliability.md): up to its optimizer
    step SIGTERM and SIGINT raise `SIGTERMException`, recorded first in case CPython drops it."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, stop: StopRequest) -> None:
        self.stop = stop
        self._previous: dict[int, Any] = {}

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return
        if self.stop.interrupted:  # asked for before this batch: do not compile first
            raise SIGTERMException()
        self._previous = {signum: signal.signal(signum, self._raise) for signum in self.SIGNALS}

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Any) -> None:
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _raise(self, signum: int, frame: Any) -> None:
        self.stop.record(signum)
        raise SIGTERMException()


class StopAtStepEnd(pl.Callback):
    """Ends training at a step's end, every DDP rank together (one all-reduce a logging window), on a
    non-finite loss or a stop request, by raising `SIGTERMException`, so that `OnExceptionCheckpoint`
    saves the step (`trainer.should_stop` would end `fit` unsaved). Lightning installs its SLURM
    requeue handler only where none is, and it would run inside the step: so the recorder is put
    aside at fit start and back at train start, Lightning's handler kept to call here."""

    def __init__(self, stop: StopRequest, every: int, requeue: bool = False) -> None:
        self.stop, self.every, self.requeue = stop, max(1, every), requeue
        self._lightning: Any = None  # Lightning's requeue handler
        self._started = False  # whether this process has trained a step

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.requeue and threading.current_thread() is threading.main_thread():
            signal.signal(REQUEUE_SIGNAL, signal.SIG_DFL)  # so that Lightning installs its own

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.requeue and threading.current_thread() is threading.main_thread():
            self._lightning = signal.getsignal(REQUEUE_SIGNAL)
            self.stop.install(REQUEUE_SIGNAL)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:  # not a step boundary
            return
        step, first = trainer.global_step, not self._started
        self._started = True
        window_end = step % self.every == 0 or step == trainer.max_steps
        preempted = self.stop.preempted and self.requeue
        stop = self.stop.interrupted or preempted
        if trainer.world_size == 1:
            if not (window_end or stop):
                return
        elif not (window_end or first):
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        flags = torch.tensor([0.0, float(stop), float(preempted)], device=pl_module.device)
        if window_end and loss is not None:
            flags[0] = (~torch.isfinite(loss.detach()).all()).float()
        if trainer.world_size > 1:
            flags = trainer.strategy.reduce(flags, reduce_op="sum")  # the ranks' one agreement
        non_finite, stop, preempted = (bool(x) for x in flags.tolist())  # the host reads it here
        if non_finite:
            value = "nan" if loss is None or torch.isnan(loss.detach()).any() else "infinite"
            raise NonFiniteLoss(f"the training loss became {value} (detected at step {step})")
        if not stop:
            return
        if preempted and callable(self._lightning):
            self._lightning(REQUEUE_SIGNAL, None)  # saves hpc_ckpt_N.ckpt, scontrol requeue
            self._remove_hpc_checkpoints(trainer, keep_newest=True)
        raise SIGTERMException()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._remove_hpc_checkpoints(trainer, keep_newest=False)

    @staticmethod
    def _remove_hpc_checkpoints(trainer: pl.Trainer, keep_newest: bool) -> None:
        if not trainer.is_global_zero:
            return
        found = sorted(Path(trainer.default_root_dir).glob("hpc_ckpt_*.ckpt"),
                       key=lambda p: int(p.stem.rsplit("_", 1)[1]))
        for path in found[:-1] if keep_newest else found:
            path.unlink(missing_ok=True)
