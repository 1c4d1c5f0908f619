"""Training pieces of the LightningModule: the learning-rate schedule, the optimizer, the loss."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F

from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.loss import label_smoothed_nll
from lightning_modules.translation import TranslationModule, lrate, noam_lrate

# Tiny models are fastest single-threaded; the default thread pool oversubscribes a busy 2-core box.
torch.set_num_threads(1)

PAD, BOS, EOS = 0, 2, 3


def paper_lrate(step: int, d_model: int, warmup: int) -> float:
    """Section 5.3: lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)."""
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@pytest.mark.parametrize("d_model,warmup", [(512, 4000), (64, 100), (1024, 4000)])
def test_noam_lrate_matches_paper_formula(d_model, warmup):
    for step in (1, 2, 10, warmup // 2, warmup - 1, warmup, warmup + 1, 3 * warmup, 100_000):
        assert noam_lrate(step, d_model, warmup) == pytest.approx(paper_lrate(step, d_model, warmup),
                                                                  rel=1e-12)
        assert noam_lrate(step, d_model, warmup, scale=2.5) == pytest.approx(
            2.5 * paper_lrate(step, d_model, warmup), rel=1e-12)


def test_noam_lrate_rises_linearly_then_decays_peaking_at_warmup():
    d_model, warmup = 512, 4000
    rates = [noam_lrate(s, d_model, warmup) for s in range(1, 3 * warmup)]
    peak_step = rates.index(max(rates)) + 1
    assert peak_step == warmup
    assert max(rates) == pytest.approx(d_model ** -0.5 * warmup ** -0.5)
    assert all(a < b for a, b in zip(rates[: warmup - 1], rates[1:warmup]))  # increasing
    assert all(a > b for a, b in zip(rates[warmup - 1:], rates[warmup:]))  # decreasing
    # linear warm-up: lrate(2s) = 2 lrate(s) before the peak; inverse sqrt after
    assert noam_lrate(200, d_model, warmup) == pytest.approx(2 * noam_lrate(100, d_model, warmup))
    assert noam_lrate(4 * 8000, d_model, warmup) == pytest.approx(noam_lrate(8000, d_model, warmup) / 2)


def test_cosine_decay_keeps_the_paper_warmup_and_peak_and_reaches_zero_at_max_steps():
    d_model, warmup, steps = 64, 300, 6000
    cosine = TrainConfig(warmup_steps=warmup, max_steps=steps, lr_scale=0.5, lr_decay="cosine")
    paper = TrainConfig(warmup_steps=warmup, max_steps=steps, lr_scale=0.5)
    peak = 0.5 * paper_lrate(warmup, d_model, warmup)
    for step in (1, 50, warmup):  # the warmup is the paper's
        assert lrate(step, d_model, cosine) == pytest.approx(lrate(step, d_model, paper), rel=1e-12)
    assert lrate(warmup, d_model, cosine) == pytest.approx(peak)
    middle = warmup + (steps - warmup) // 2
    assert lrate(middle, d_model, cosine) == pytest.approx(peak / 2, rel=1e-3)  # half-way: half the peak
    assert lrate(steps, d_model, cosine) == pytest.approx(0.0, abs=1e-12)
    after = [lrate(s, d_model, cosine) for s in range(warmup, steps + 1)]
    assert all(a >= b for a, b in zip(after, after[1:]))  # never rises after the peak
    assert lrate(steps, d_model, paper) == pytest.approx(0.5 * paper_lrate(steps, d_model, warmup))


def make_module(d_model: int = 32, warmup: int = 10, lr_scale: float = 1.0) -> TranslationModule:
    torch.manual_seed(0)
    model = TransformerConfig(n_layers=1, d_model=d_model, d_ff=2 * d_model, n_heads=4, dropout=0.0,
                              label_smoothing=0.1, vocab_size=50, max_len=32)
    train = TrainConfig(warmup_steps=warmup, lr_scale=lr_scale, max_steps=100)
    return TranslationModule(model=asdict(model), train=asdict(train))


def test_optimizer_is_adam_with_paper_settings_and_noam_schedule():
    d_model, warmup = 32, 10
    module = make_module(d_model, warmup)
    configured = module.configure_optimizers()
    optimizer = configured["optimizer"]
    scheduler = configured["lr_scheduler"]["scheduler"]
    assert configured["lr_scheduler"]["interval"] == "step"
    assert type(optimizer) is torch.optim.Adam
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98)
    assert group["eps"] == 1e-9
    optimized = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for p in module.parameters()}

    src = torch.tensor([[5, 6, 7], [8, 9, PAD]])
    tgt_in, tgt_out = torch.tensor([[BOS, 10, 11]]).repeat(2, 1), torch.tensor([[10, 11, EOS]]).repeat(2, 1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(paper_lrate(1, d_model, warmup))
    for k in range(1, 2 * warmup + 3):
        before = module.model.embedding.weight.detach().clone()
        loss, _, n = label_smoothed_nll(module(src, tgt_in), tgt_out, PAD, 0.1)
        optimizer.zero_grad()
        (loss / n).backward()
        optimizer.step()
        scheduler.step()
        assert not torch.equal(before, module.model.embedding.weight)  # it really trains
        # after k scheduler steps the optimizer runs step k + 1 of the paper's schedule
        assert optimizer.param_groups[0]["lr"] == pytest.approx(paper_lrate(k + 1, d_model, warmup),
                                                                rel=1e-9)


def test_lr_scale_multiplies_the_schedule():
    module = make_module(d_model=32, warmup=10, lr_scale=0.5)
    optimizer = module.configure_optimizers()["optimizer"]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.5 * paper_lrate(1, 32, 10))


def reference_smoothed_loss(logits: torch.Tensor, target: torch.Tensor, eps: float):
    """Per token (1-eps)(-log p_y) + eps * mean_v(-log p_v), summed over non-pad tokens, by loops."""
    log_p = logits.double().log_softmax(-1)
    loss = nll = 0.0
    count = 0
    for b in range(target.size(0)):
        for t in range(target.size(1)):
            y = int(target[b, t])
            if y == PAD:
                continue
            count += 1
            nll_token = -float(log_p[b, t, y])
            uniform = -float(log_p[b, t].mean())
            loss += (1 - eps) * nll_token + eps * uniform
            nll += nll_token
    return loss, nll, count


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_label_smoothed_nll_matches_formula(eps):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 3
    target = torch.randint(1, 11, (3, 5), generator=g)
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    loss, nll, n_tokens = label_smoothed_nll(logits, target, PAD, eps)
    ref_loss, ref_nll, ref_count = reference_smoothed_loss(logits, target, eps)
    assert int(n_tokens) == ref_count == 15 - 2 - 4
    assert float(loss) == pytest.approx(ref_loss, rel=1e-5)
    assert float(nll) == pytest.approx(ref_nll, rel=1e-5)
    # the NLL part is plain cross entropy over the non-pad tokens
    ce = F.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=PAD, reduction="sum")
    assert float(nll) == pytest.approx(float(ce), rel=1e-6)
    assert not nll.requires_grad


def test_label_smoothed_nll_ignores_whatever_sits_at_pad_positions():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 4, 9, generator=g, requires_grad=True)
    target = torch.tensor([[4, 5, PAD, PAD], [6, 7, 8, PAD]])
    loss, nll, _ = label_smoothed_nll(logits, target, PAD, 0.1)
    changed = logits.detach().clone()
    changed[target == PAD] = torch.randn(int((target == PAD).sum()), 9, generator=g) * 10
    loss2, nll2, _ = label_smoothed_nll(changed, target, PAD, 0.1)
    assert loss.item() == pytest.approx(loss2.item(), rel=1e-6)
    assert float(nll) == pytest.approx(float(nll2), rel=1e-6)
    loss.backward()
    assert logits.grad[target == PAD].abs().sum() == 0
    assert logits.grad[target != PAD].abs().sum() > 0


def test_label_smoothing_penalises_overconfidence():
    """Smoothing punishes over-confidence: a one-hot-peaked prediction costs more with eps > 0."""
    logits = torch.full((1, 1, 10), -20.0)
    logits[0, 0, 4] = 20.0
    target = torch.tensor([[4]])
    plain, _, _ = label_smoothed_nll(logits, target, PAD, 0.0)
    smoothed, _, _ = label_smoothed_nll(logits, target, PAD, 0.1)
    # -log p_v = 40 for the 9 wrong classes (up to exp(-40)), ~0 for the right one
    assert float(plain) == pytest.approx(0.0, abs=1e-6)
    assert float(smoothed) == pytest.approx(0.1 * 9 * 40 / 10, rel=1e-4)
    assert math.isfinite(float(smoothed))



class _Sleeper(pl.LightningModule):
    """Training steps take ~20 ms, validation steps ~100 ms: the clock must count only the former."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return (self.w - 1).pow(2).sum()

    def validation_step(self, batch, batch_idx):
        time.sleep(0.1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_training_clock_excludes_validation_and_counts_tokens(tmp_path):
    from torch.utils.data import DataLoader

    from lightning_modules.callbacks import TrainingClock

    batches = [{"n_tokens": torch.tensor(7)} for _ in range(20)]
    clock = TrainingClock()
    trainer = pl.Trainer(max_steps=20, val_check_interval=5, limit_val_batches=2, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=[clock])
    started = time.perf_counter()
    trainer.fit(_Sleeper(), DataLoader(batches, batch_size=None),
                DataLoader(batches[:2], batch_size=None))
    wall = time.perf_counter() - started
    assert clock.target_tokens == 20 * 7
    # 20 training steps of >= 20 ms, after every validation too; 4 validations of 200 ms excluded.
    assert 20 * 0.02 <= clock.train_time_s <= wall - 4 * 2 * 0.1
    assert clock.tokens_per_s == pytest.approx(140 / clock.train_time_s)


# A stopwatch runs 6 s of host clock in a child process that the test stops (SIGSTOP) for 4 s of
# them; the watcher's thresholds are lowered so that a 4 s stop counts (the default is 10 s).
STOPPED_CHILD = r"""
import json, sys, time
from lightning_modules import stopwatch
stopwatch.TICK_S, stopwatch.STOPPED_AFTER_S = 0.1, 1.0
watch = stopwatch.Stopwatch()
started = time.perf_counter()
watch.start()
print("running", flush=True)
while time.perf_counter() - started < 6.0:
    time.sleep(0.05)
watch.stop()
print(json.dumps({"wall": time.perf_counter() - started, "clock": watch.seconds}), flush=True)
"""


def test_the_training_clock_leaves_out_a_stretch_in_which_the_process_was_stopped():
    """SIGSTOP (Ctrl-Z, SLURM's `scontrol suspend`) holds every thread while the host clock runs
    on: the stopwatch counts the 6 s less the 4 s stopped, to within the watcher's tick."""
    child = subprocess.Popen([sys.executable, "-c", STOPPED_CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "running"
    time.sleep(1.0)
    os.kill(child.pid, signal.SIGSTOP)
    stopped = time.perf_counter()
    time.sleep(4.0)
    os.kill(child.pid, signal.SIGCONT)
    stopped = time.perf_counter() - stopped
    measured = json.loads(child.communicate(timeout=60)[0])
    assert child.returncode == 0
    assert measured["wall"] == pytest.approx(6.0, abs=1.5)
    expected = measured["wall"] - stopped
    assert expected - 0.1 <= measured["clock"] <= expected + 0.2 + 0.1, (measured, stopped)  # one tick (0.1 s) each way
