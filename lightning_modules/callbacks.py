"""Callbacks of a run: what it measures (training wall time, target tokens/s), fault points, the
divergence guard, and how signals stop it (SIGTERM while compiling, SLURM's pre-emption notice)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from lightning_modules.run.faults import inject
from lightning_modules.run.slurm import REQUEUE_SIGNAL, PreemptionNotice
from lightning_modules.stopwatch import Stopwatch


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), else None."""
    try:
        start_ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class TrainingClock(pl.Callback):
    """Accumulates training time and target tokens; the totals survive checkpoint/resume.

    Also measures this process's start-up (process start to the first training step, the data,
    model and Trainer set-up included), the first step's own time (which holds torch.compile's
    compilation) and the steady-state rate: target tokens/s between the log-window boundaries
    after the first one (synchronised with the device there, once per window, so these times
    are the device's).
    """

    def __init__(self, every: int = 50) -> None:
        self.training = Stopwatch()  # validation inside fit left out
        self.target_tokens = 0
        self.every = max(1, every)
        self.startup_s: float | None = None
        self.first_step_s: float | None = None
        self._first_started: float | None = None
        self._marks: list[tuple[float, int]] = []  # (time, tokens) at window boundaries

    @property
    def state_key(self) -> str:
        return "TrainingClock"

    @property
    def train_time_s(self) -> float:
        return self.training.seconds

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
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
            self.startup_s = process_age_s()
            self._first_started = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        # Every rank sees its own shard: count this rank's tokens times the number of ranks.
        # `n_tokens` is a host-side int (collate), so counting never waits for the GPU.
        self.target_tokens += int(batch["n_tokens"]) * trainer.world_size
        first = self.first_step_s is None and self._first_started is not None
        mark = trainer.global_step % self.every == 0
        if (first or mark) and pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)  # once per window: the device's real time
        if first:
            self.first_step_s = time.perf_counter() - self._first_started
        if mark:
            self._marks.append((time.perf_counter(), self.target_tokens))

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


class PromptInterruptWhileCompiling(pl.Callback):
    """SIGTERM during torch.compile's compilation stops the run at once.

    Lightning defers SIGTERM to the end of the current batch, so that no checkpoint holds a half-
    applied optimizer step; but a compiled run's first batch compiles for minutes, and a later
    batch may recompile (a guard that fails; seen on an H100: ~50 s for the base model), and the
    signal would wait for all of it. From every batch's start until its optimizer step (no weight
    has changed yet) this handler raises Lightning's own `SIGTERMException` at once; from the
    optimizer step on, Lightning's deferred handler is back.
    """

    def __init__(self) -> None:
        self._previous: Any = None

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self._previous is not None or threading.current_thread() is not threading.main_thread():
            return
        self._previous = signal.signal(signal.SIGTERM, _raise_sigterm)

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Any) -> None:
        self._restore()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None


def _raise_sigterm(signum: int, frame: Any) -> None:
    raise SIGTERMException()


class RequeueAtStepEnd(pl.Callback):
    """Under SLURM: Lightning's requeue handler at the end of a training step, then stop.

    Lightning installs its SIGUSR1 handler (save `hpc_ckpt_N.ckpt` in the Trainer's
    `default_root_dir`, `scontrol requeue`) just before training, and only where no handler is
    installed; it would run inside whatever the step is doing. So: the notice's recorder is put
    aside when fitting starts (Lightning installs its handler), Lightning's handler is put aside
    when training starts (the recorder is back), and at the end of the step that saw the signal,
    on every DDP rank together, Lightning's handler runs and the run stops like on SIGTERM
    (Lightning's `SIGTERMException`). Only the newest hpc checkpoint is kept, and none once
    training finishes (`last.ckpt` holds the end). See `lightning_modules/run/slurm.py`.
    """

    def __init__(self, notice: PreemptionNotice) -> None:
        self.notice = notice
        self._lightning: Any = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            signal.signal(REQUEUE_SIGNAL, signal.SIG_DFL)  # so that Lightning installs its own

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if threading.current_thread() is threading.main_thread():
            self._lightning = signal.getsignal(REQUEUE_SIGNAL)
            self.notice.install()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:  # not a step boundary
            return
        if not trainer.strategy.reduce_boolean_decision(self.notice.pending, all=False):
            return
        self.notice.pending = False
        if callable(self._lightning):
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
