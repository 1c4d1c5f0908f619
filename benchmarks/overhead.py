"""Benchmark 2: what the Lightning harness costs per step: the same module and batches under
`lightning.Trainer` (as `ablate train` runs it) and in a plain loop, alternated (the notes say the rest)."""

from __future__ import annotations

import copy
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from benchmarks.common import (LIGHTNING_PRECISION, Batch, Section, Settings, data_module, median, on_device,
                               spread, stopwatch, sync, token_batches)
from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.loss import label_smoothed_nll
from lightning_modules.translation import TranslationModule

TARGET_OVERHEAD = 0.03


class _StepClock(pl.Callback):
    """Wall time from the start of batch `warmup` to the end of training."""

    def __init__(self, warmup: int, device: torch.device) -> None:
        self.warmup, self.device = warmup, device
        self.start: float | None = None
        self.seconds = float("nan")
        self.train_start = self.train_end = float("nan")

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_start = time.perf_counter()

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.warmup and self.start is None:
            sync(self.device)
            self.start = time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        sync(self.device)
        self.train_end = time.perf_counter()
        if self.start is not None:
            self.seconds = self.train_end - self.start


def _loader(batches: list[Batch]) -> DataLoader:
    """The prebuilt batches, as-is, in a fixed order (no workers, like `ablate`'s default)."""
    return DataLoader(batches, batch_size=None, shuffle=False)


def lightning_run(module: TranslationModule, batches: list[Batch], steps: int, warmup: int,
                  settings: Settings) -> tuple[float, float]:
    """(seconds for steps warmup..steps, seconds of Trainer() + fit() outside the training loop)."""
    wall = time.perf_counter()
    clock = _StepClock(warmup, settings.device)
    trainer = pl.Trainer(
        accelerator="gpu" if settings.device.type == "cuda" else "cpu", devices=1,
        precision=LIGHTNING_PRECISION[settings.precision],
        max_steps=steps, max_epochs=-1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_val_batches=0, use_distributed_sampler=False, log_every_n_steps=50,
        callbacks=[clock])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, train_dataloaders=_loader(batches))
    wall = time.perf_counter() - wall
    return clock.seconds, wall - (clock.train_end - clock.train_start)


def plain_run(module: TranslationModule, batches: list[Batch], steps: int, warmup: int,
              settings: Settings) -> float:
    """Seconds for steps warmup..steps of a hand-written loop over the same module."""
    module.train()
    configured = module.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    c = module.model_config
    start = None
    step = 0
    while step < steps:
        for batch in _loader(batches):
            if step == warmup:
                sync(settings.device)
                start = time.perf_counter()
            batch = on_device(batch, settings.device, non_blocking=True)
            with settings.autocast():
                logits = module(batch["src"], batch["tgt_in"])
            loss, _, n_tokens = label_smoothed_nll(logits, batch["tgt_out"], c.pad_id,
                                                   c.label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            (loss / n_tokens.clamp(min=1)).backward()
            optimizer.step()
            scheduler.step()
            step += 1
            if step == steps:
                break
    sync(settings.device)
    return time.perf_counter() - start if start is not None else float("nan")


class _UnloggedModule(TranslationModule):
    """The same module without its per-step `self.log` calls (to split the overhead)."""

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        logits = self.model(batch["src"], batch["tgt_in"])
        loss, _, n_tokens = label_smoothed_nll(logits, batch["tgt_out"], self.model_config.pad_id,
                                               self.model_config.label_smoothing)
        return loss / n_tokens.clamp(min=1)


def run(settings: Settings) -> Section:
    section = Section("overhead", "2. Harness overhead: Lightning Trainer vs a plain loop",
                      ["loop", "steps timed", "ms/step", "steps/s", "overhead", "spread",
                       "fit setup s"], formats={"overhead": "{:+.1%}"})
    for name in ("lightning.pytorch", "lightning.fabric", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # no "GPU available" / tips per fit
    quick = settings.quick
    config = TransformerConfig(n_layers=1 if quick else 3, d_model=64, d_ff=256, n_heads=8,
                               vocab_size=2000, max_len=256)
    steps, warmup = (6, 2) if quick else (40, 5)
    reps = settings.reps_or(2 if quick else 5)
    with stopwatch(section):
        dm = data_module(settings, config.vocab_size)
        batches = token_batches(dm, 200 if quick else 1500, 8 if quick else 20, seed=settings.seed)
        torch.manual_seed(settings.seed)
        train = TrainConfig(max_steps=steps, warmup_steps=200, lr_scale=0.5, wandb="off",
                            progress_bar=False)
        initial = TranslationModule.from_configs(config, train).state_dict()

        def fresh(cls: type[TranslationModule] = TranslationModule) -> TranslationModule:
            module = cls.from_configs(config, train)
            module.load_state_dict(copy.deepcopy(initial))
            return module.to(settings.device)

        setup: list[float] = []

        def lightning(cls: type[TranslationModule]) -> Callable[[int], float]:
            def go(n_steps: int) -> float:
                seconds, outside = lightning_run(fresh(cls), batches, n_steps, warmup, settings)
                if n_steps == steps and cls is TranslationModule:
                    setup.append(outside)
                return seconds
            return go

        variants: dict[str, Callable[[int], float]] = {
            "plain": lambda n_steps: plain_run(fresh(), batches, n_steps, warmup, settings),
            "Lightning": lightning(TranslationModule),
            "Lightning, no self.log": lightning(_UnloggedModule),
        }
        for go in variants.values():  # warm-up (allocator, threads, imports), not timed
            go(warmup + 1)
        timed: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for rep in range(reps):
            for name in (names if rep % 2 == 0 else names[::-1]):
                timed[name].append(variants[name](steps))
        n = steps - warmup
        plain_s = median(timed["plain"])
        overhead = median(timed["Lightning"]) / plain_s - 1
        for name in names:
            seconds = median(timed[name])
            section.rows.append({"loop": name, "steps timed": n, "ms/step": 1000 * seconds / n,
                                 "steps/s": n / seconds,
                                 "overhead": seconds / plain_s - 1 if name != "plain" else None,
                                 "spread": spread(timed[name]),
                                 "fit setup s": median(setup) if name == "Lightning" else None})
        section.target("Lightning overhead per step", overhead, f"≤ {TARGET_OVERHEAD:.0%}",
                       overhead <= TARGET_OVERHEAD)
        section.data = {"times_s": timed, "fit_setup_s": setup, "steps": steps, "warmup": warmup,
                        "config": vars(config).copy(), "ratio_lightning_over_plain": 1 + overhead}
    section.notes += [
        f"Demo dimensions (N {config.n_layers}, d_model {config.d_model}), {len(batches)} Ding "
        f"batches cycled, {n} timed steps after {warmup} warm-up steps per repetition, {reps} "
        "repetitions alternating the order, each from the same initial weights.",
        "overhead = ms/step ÷ plain ms/step − 1. The plain loop calls the same module's forward, "
        "the project's label_smoothed_nll, and its configure_optimizers() optimizer and "
        "scheduler; 'Lightning, no self.log' is the same module minus its four per-step "
        "self.log calls (diagnostic: how much of the overhead is logging). 'fit setup s' "
        "(Trainer construction, fit's setup and teardown) is outside the per-step figure: it "
        "is paid once per run.",
    ]
    return section
