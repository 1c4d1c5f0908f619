"""The LightningModule that trains a `Transformer` for translation, as in section 5 of the paper."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor
from torchmetrics import SumMetric

from lightning_modules.callbacks import TrainingClock
from lightning_modules.compiling import compile_dynamic
from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.loss import label_smoothed_nll, projected_label_smoothed_nll
from lightning_modules.transformer import Transformer, count_parameters


def noam_lrate(step: int, d_model: int, warmup_steps: int, scale: float = 1.0) -> float:
    """lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), steps counted from 1.

    Without warmup (`warmup_steps` 0) the ramp term is gone: d_model^-0.5 · step^-0.5, which starts
    at d_model^-0.5 (above any warmed-up peak, d_model^-0.5 · warmup^-0.5) and meets the warmed-up
    schedule where that one peaks."""
    step = max(step, 1)
    if warmup_steps == 0:
        return scale * d_model ** -0.5 * step ** -0.5
    return scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def lrate(step: int, d_model: int, train: TrainConfig) -> float:
    """The learning rate at `step` (from 1): the paper's warmup, then `train.lr_decay`.

    "rsqrt" is the paper's schedule. "cosine" keeps its warmup and peak and then follows a half
    cosine from that peak to zero at `train.max_steps`: a run that ends at a learning rate near
    zero has settled for its budget, which the paper's slow decay does not reach in few steps.
    """
    if train.lr_decay == "rsqrt" or step <= train.warmup_steps:
        return noam_lrate(step, d_model, train.warmup_steps, train.lr_scale)
    peak = noam_lrate(max(train.warmup_steps, 1), d_model, train.warmup_steps, train.lr_scale)
    progress = min(1.0, (step - train.warmup_steps) / max(1, train.max_steps - train.warmup_steps))
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


class TranslationModule(pl.LightningModule):
    """Label-smoothed training, Adam(0.9, 0.98, 1e-9) with the warmup schedule, dev perplexity.

    The training step never waits for the GPU: loss, NLL, token counts and the gradient norm
    are summed on the device and read (one transfer) every `log_every_n_steps` steps, where they
    are logged as window means, with the window's target tokens per second of training (a lap of
    the run's one training clock, `callbacks.TrainingClock`, read at window ends, where that
    transfer has waited for the device; validation inside fit left out, a first window's
    compilation left in); every window but the last spans at least that many steps (a resume
    inside one carries its first steps into the next), since the spike rule compares them. `compile_step()` swaps the forward + loss for a
    `torch.compile`d one (dynamic shapes: one graph for every batch shape); validation and
    decoding stay eager.
    """

    def __init__(self, model: dict, train: dict) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model_config = TransformerConfig(**model)
        self.train_config = TrainConfig(**train)
        self.model = Transformer(self.model_config)
        self.val_nll = SumMetric()
        self.val_tokens = SumMetric()
        self._forward_loss_fn = self.forward_loss
        self._window: Tensor | None = None  # summed (loss, nll, tokens, batches, grad norm) since the last log
        self._grad_max: Tensor | None = None
        self._window_start = self._flushed_at = 0
        self._clock: TrainingClock | None = None  # the trainer's, whose laps time the windows
        self._lr = 0.0

    def forward_loss(self, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, epsilon: float
                     ) -> tuple[Tensor, Tensor, Tensor]:
        """Summed label-smoothed loss, summed NLL and target-token count of one batch: from the full
        logits, or with `train.loss_chunks` from the decoder's output in row chunks (no full logits)."""
        pad, chunks = self.model_config.pad_id, self.train_config.loss_chunks
        if chunks:
            hidden = self.model.hidden_states(src, tgt_in)  # (B, T, d_model)
            return projected_label_smoothed_nll(hidden, self.model.output_weight(), tgt_out, pad, epsilon, chunks)
        return label_smoothed_nll(self.model(src, tgt_in), tgt_out, pad, epsilon)

    def compile_step(self, backend: str = "inductor") -> None:
        """Train through `torch.compile(forward_loss, dynamic=True, mode=train.compile_mode)`
        from now on (`backend`: torch.compile's; "aot_eager" traces without Inductor)."""
        self._forward_loss_fn = compile_dynamic(self.forward_loss, self.train_config.compile_mode, backend)

    @classmethod
    def from_configs(cls, model: TransformerConfig, train: TrainConfig) -> "TranslationModule":
        return cls(model=asdict(model), train=asdict(train))

    @property
    def n_parameters(self) -> int:
        return count_parameters(self.model_config)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.model(src, tgt_in)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss, nll, n_tokens = self._forward_loss_fn(batch["src"], batch["tgt_in"], batch["tgt_out"],
                                                    self.model_config.label_smoothing)
        n = n_tokens.clamp(min=1)
        self._accumulate(torch.stack([loss.detach().float(), nll.detach().float(), n_tokens.float(),
                                      loss.new_ones((), dtype=torch.float32), loss.new_zeros((), dtype=torch.float32)]))
        return loss / n

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Global L2 norm of the gradients (before clipping), kept on the device for the window."""
        self._lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (a host float)
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not grads:
            return
        norm = torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False).float()
        self._grad_max = norm if self._grad_max is None else torch.maximum(self._grad_max, norm)
        self._accumulate(torch.cat([norm.new_zeros(4), norm[None]]))  # only the grad-norm slot

    def _accumulate(self, values: Tensor) -> None:
        """Add (loss, nll, tokens, batches, grad norm) of one batch/step to the window, on device."""
        self._window = values if self._window is None else self._window + values

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Every log_every_n_steps optimizer steps (and at the last): one read, window means logged.

        Lightning converts every logged device tensor to a number on each step (a GPU sync per
        step): the values logged here are CPU tensors from a single device-to-host copy per window.
        """
        step, every, last = self.trainer.global_step, self.trainer.log_every_n_steps, self.trainer.max_steps
        if self._window is None or step == self._flushed_at:
            return
        if step != last and (step % every or step - self._window_start < every):
            return  # not a row's end; a window begun by a resume is carried into the next row
        grad_max = self._grad_max if self._grad_max is not None else self._window.new_zeros(())
        host = torch.cat([self._window, grad_max[None]]).cpu()  # the window's one device-to-host copy
        self._window, self._grad_max, self._flushed_at = None, None, step
        seconds = self._clock.lap() if self._clock is not None else 0.0
        loss_sum, nll_sum, tokens, batches, grad_sum, grad_max = host
        n = tokens.clamp(min=1)
        steps = max(1, step - self._window_start)
        self._window_start = step
        self.log("train/loss", loss_sum / n, prog_bar=True)
        self.log("train/nll", nll_sum / n)
        self.log("train/tokens", tokens / batches.clamp(min=1))  # mean target tokens per batch
        self.log("train/grad_norm", grad_sum / steps)  # mean over the window's optimizer steps
        self.log("train/grad_norm_max", grad_max)
        self.log("train/lr", host.new_tensor(self._lr), prog_bar=True)
        if seconds > 0:  # every rank trains its own shard for the same time
            self.log("train/tokens_per_s", tokens * self.trainer.world_size / seconds)

    def on_train_start(self) -> None:
        self._window_start = self._flushed_at = self.trainer.global_step  # also after a resume
        self._clock = TrainingClock.of(self.trainer)  # its lap starts with training (callbacks go first)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits = self.model(batch["src"], batch["tgt_in"])
        _, nll, n_tokens = label_smoothed_nll(logits, batch["tgt_out"], self.model_config.pad_id, 0.0)
        self.val_nll.update(nll)
        self.val_tokens.update(n_tokens.float())

    def on_validation_epoch_end(self) -> None:
        nll, tokens = self.val_nll.compute(), self.val_tokens.compute()  # summed over ranks
        mean_nll = (nll / tokens.clamp(min=1)).item()
        # Identical on every rank (the sums are already all-reduced): averaging them is a no-op.
        self.log("val/nll", mean_nll, sync_dist=True)
        self.log("val/ppl", math.exp(min(mean_nll, 50.0)), prog_bar=True, sync_dist=True)
        self.val_nll.reset()
        self.val_tokens.reset()

    def configure_optimizers(self):
        t = self.train_config
        # The fused CUDA kernel updates all parameters in a few launches (~10% of a base step).
        fused = all(p.is_cuda for p in self.parameters())
        optimizer = torch.optim.Adam(self.parameters(), lr=1.0, betas=(t.adam_beta1, t.adam_beta2),
                                     eps=t.adam_eps, fused=fused or None)
        d_model = self.model_config.d_model
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda i: lrate(i + 1, d_model, t))
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": schedule, "interval": "step", "frequency": 1}}
