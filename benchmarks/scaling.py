"""Benchmark 5: how our training step scales with sequence length (attention grows as n², so tokens/s
falls once it dominates) and with batch tokens (tokens/s rises until the cores are saturated)."""

from __future__ import annotations

import torch

from benchmarks.common import (Section, Settings, alternate, forward_flops, median, mfu, random_batch, spread,
                               stopwatch, train_flops)
from benchmarks.train_step import make_step
from lightning_modules.config import TransformerConfig
from lightning_modules.transformer import Transformer


def run(settings: Settings) -> Section:
    section = Section("scaling", "5. Scaling: step time vs sequence length and batch tokens",
                      ["sweep", "sentences", "length", "tokens/side", "ms/step", "tgt tokens/s",
                       "attention FLOP share", "TFLOP/s", "MFU", "spread"],
                      formats={"attention FLOP share": "{:.1%}"})
    quick = settings.quick
    config = TransformerConfig(n_layers=1 if quick else 3, d_model=64, d_ff=256, n_heads=8,
                               vocab_size=2000, max_len=512)
    sentences = 4 if quick else 16
    lengths = [8, 16] if quick else [16, 32, 64, 128, 256]
    fixed_length = 16 if quick else 32
    budgets = [128, 256] if quick else [1000, 2000, 4000, 8000, 16000]
    reps = settings.reps_or(2 if quick else 3)
    points = ([("length", sentences, n) for n in lengths]
              + [("batch tokens", max(1, tokens // fixed_length), fixed_length) for tokens in budgets])
    with stopwatch(section):
        torch.manual_seed(settings.seed)
        model = Transformer(config).to(settings.device).train()
        step = make_step(model, config, settings)
        for sweep, count, length in points:
            batch = random_batch(count, length, length, config.vocab_size, settings.device)
            times = alternate({"step": lambda b=batch: step(b)}, reps, settings.device)["step"]
            seconds = median(times)
            flops = forward_flops(config, batch)
            achieved = train_flops(config, batch) / seconds
            section.rows.append({
                "sweep": sweep, "sentences": count, "length": length,
                "tokens/side": count * length, "ms/step": 1000 * seconds,
                "tgt tokens/s": count * length / seconds,
                "attention FLOP share": flops["attention"] / flops["total"],
                "TFLOP/s": achieved / 1e12, "MFU": mfu(achieved, settings.device),
                "spread": spread(times)})
            print(f"[scaling] {sweep}: {count} × {length}: {1000 * seconds:.1f} ms/step", flush=True)
    section.data = {"config": vars(config).copy(), "reps": reps}
    section.notes += [
        f"Our model at N {config.n_layers}, d_model {config.d_model}, d_ff {config.d_ff}, "
        f"h {config.n_heads}, vocab {config.vocab_size:,}; random ids, no padding; one warm-up "
        f"step then the median of {reps} steps per point.",
        "attention FLOP share: QKᵀ and attention-weighted values among all matmul FLOPs "
        "(causal self-attention counted in full).",
    ]
    return section
