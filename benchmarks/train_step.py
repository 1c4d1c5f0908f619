"""Benchmark 1: training-step throughput of our `Transformer` against its peers at equal dims.

Each model takes the same steps on the same token-bucketed batches: forward, label-smoothed
cross-entropy (ε_ls 0.1, padding ignored, summed then divided by the target tokens), backward and
an Adam(0.9, 0.98, 1e-9) step. The models are timed in alternating order over several
repetitions; we report median ms/step, target tokens/s and the ratio ours/peer.

Sizes: `base` is the paper's base model (N 6, d_model 512, d_ff 2048, h 8, vocab 37,000) on the
real shapes of Ding batches (BPE 8,000) whose ids are mapped into 37,000 by a fixed random map;
`demo` is the demo preset's base row (N 3, d_model 64, d_ff 256, h 8, vocab 2,000) on real Ding
batches of 1,500 tokens.

With `--precision fp32,bf16` every model steps in each precision, all alternated in one process, and
a matrix product alone (MATMUL_N square, per precision) gives what the device's matmuls reach:
`of matmul` reads a step's FLOP/s against it, `vs fp32` a model's tokens/s against its own in fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from benchmarks.common import (
    DTYPES,
    Batch,
    Section,
    Settings,
    alternate,
    batch_stats,
    data_module,
    free_memory,
    median,
    mfu,
    over_fp32,
    remap_vocabulary,
    spread,
    stopwatch,
    token_batches,
    train_flops,
)
from benchmarks.peers import (
    MarianPeer,
    TorchTransformer,
    load_into_marian,
    load_into_torch,
    logits_error,
    trainable_parameters,
)
from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.transformer import Transformer, count_parameters
from lightning_modules.translation import label_smoothed_nll, noam_lrate

TARGET_RATIO = 1.3
MATMUL_N = 2048  # the matrix product alone: MATMUL_N² by MATMUL_N² (--quick: 256)
SAME_FUNCTION_TOLERANCE = 1e-3  # max |Δlogits| (fp32, eval mode) after copying our weights


@dataclass
class Size:
    """A model size and the batches it is timed on."""

    name: str
    model: TransformerConfig
    data_vocab: int  # BPE vocabulary of the Ding batches (ids remapped when it differs)
    max_tokens: int
    batches: int  # batches per repetition
    reps: int
    bf16_target: float  # bf16 tokens/s over fp32's, ours, at least (with --precision fp32,bf16)


def sizes(quick: bool) -> list[Size]:
    if quick:  # smoke-test scale: every code path (vocabulary remap included), seconds
        return [Size("base-shaped (quick)", TransformerConfig(n_layers=1, d_model=64, d_ff=128,
                                                              n_heads=4, vocab_size=37000),
                     2000, 200, 1, 2, 1.8),
                Size("demo (quick)", TransformerConfig(n_layers=1, d_model=64, d_ff=256,
                                                       n_heads=8, vocab_size=2000, max_len=256),
                     2000, 200, 2, 2, 1.3)]
    return [Size("base", TransformerConfig(n_layers=6, d_model=512, d_ff=2048, n_heads=8,
                                           vocab_size=37000, max_len=512), 8000, 1500, 1, 3, 1.8),
            Size("demo", TransformerConfig(n_layers=3, d_model=64, d_ff=256, n_heads=8,
                                           vocab_size=2000, max_len=256), 2000, 1500, 8, 5, 1.3)]


def make_step(model: nn.Module, config: TransformerConfig, settings: Settings
              ) -> Callable[[Batch, str | None], None]:
    """One optimizer step of `model` on a batch in a precision (default: the run's), the same for every model."""
    params = [p for p in model.parameters() if p.requires_grad]
    lr = noam_lrate(4000, config.d_model, 4000)  # the schedule's peak; speed does not depend on it
    t = TrainConfig()  # the paper's Adam, as every run has it
    optimizer = torch.optim.Adam(params, lr=lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps)

    def step(batch: Batch, precision: str | None = None) -> None:
        with settings.autocast(precision):
            logits = model(batch["src"], batch["tgt_in"])
        loss, _, n_tokens = label_smoothed_nll(logits, batch["tgt_out"], config.pad_id,
                                               config.label_smoothing)
        (loss / n_tokens.clamp(min=1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def build_models(config: TransformerConfig, device: torch.device
                 ) -> tuple[dict[str, nn.Module], list[str]]:
    """Ours, nn.Transformer and (if `transformers` is installed) Marian, in train mode."""
    notes = []
    models: dict[str, nn.Module] = {"ours": Transformer(config), "nn.Transformer": TorchTransformer(config)}
    try:
        models["Marian"] = MarianPeer(config)
    except ImportError:
        notes.append("Marian skipped: `transformers` is not installed (pip install -e '.[bench]').")
    for model in models.values():
        model.to(device).train()
    return models, notes


def matmul_rates(settings: Settings) -> Section:
    """FLOP/s of one square matrix product alone in each precision (bf16: of bf16 matrices, as
    autocast hands them to a linear layer), alternated, median of the repetitions."""
    n = 256 if settings.quick else MATMUL_N
    section = Section("matmul", f"1b. A {n}×{n} matrix product alone", ["precision", "TFLOP/s", "spread"])
    a, b = torch.randn(2, n, n, generator=torch.Generator().manual_seed(settings.seed)).to(settings.device)
    pairs = {p: (a.to(DTYPES[p]), b.to(DTYPES[p])) for p in settings.compared}
    times = alternate({p: lambda x=x, y=y: x @ y for p, (x, y) in pairs.items()}, settings.reps_or(7), settings.device)
    for p, seconds in times.items():
        section.rows.append({"precision": p, "TFLOP/s": 2 * n ** 3 / median(seconds) / 1e12, "spread": spread(seconds)})
    section.data = {"n": n, "times_s": times}
    return section


def run(settings: Settings) -> Section:
    section = Section("train", "1. Training step throughput (forward + backward + Adam step)",
                      ["size", "model", "precision", "params", "ms/step", "tgt tokens/s", "ours/peer", "vs fp32",
                       "spread", "TFLOP/s", "of matmul", "MFU"], formats={"of matmul": "{:.0%}"})
    with stopwatch(section):
        section.more.append(matmul_rates(settings))
        peak = {r["precision"]: r["TFLOP/s"] for r in section.more[0].rows}
        for size in sizes(settings.quick):
            _run_size(size, settings, section, peak)
    section.notes += [
        "Same batches, same initial weights (ours copied into each peer; their logits are checked "
        f"equal to ours within {SAME_FUNCTION_TOLERANCE:g} in eval mode), same loss "
        "(label-smoothed CE, ε 0.1, pad ignored) and Adam(0.9, 0.98, 1e-9) for every model; "
        "timed in alternating order, median over repetitions; `ours/peer` is the ratio of "
        "tokens/s (> 1: ours is faster).",
        "base: real Ding batch shapes (BPE 8,000) with ids mapped into the 37,000 vocabulary by a "
        "fixed random injection (Ding is too small for a 37,000-piece BPE); demo: real Ding "
        "batches (BPE 2,000).",
        "nn.Transformer: wrapped with the shared ×√d_model embedding, sinusoidal positions and the "
        "tied projection; its final LayerNorms and its extra dropouts (attention weights, inside "
        "the FFN) are switched off so that it is the paper's network, like ours and Marian.",
        "Marian: MarianMTModel(MarianConfig(...)) at the same dims (post-LN, ReLU, scaled tied "
        "embeddings, dropout P_drop, attention/activation dropout 0), SDPA attention.",
        "spread: (max − min)/median of the repetitions. TFLOP/s: matmul FLOPs (3 × forward, "
        "attention counted in full) per second; `of matmul`: of what the matrix product alone reaches "
        "in the same precision (1b); MFU only on CUDA devices of known bf16 peak.",
        "precision: fp32, or bf16 autocast (matmuls and attention in bf16; norms, the loss and Adam's "
        "states in fp32) for every model alike; `vs fp32`: the model's tokens/s over its own in fp32.",
    ]
    return section


def _run_size(size: Size, settings: Settings, section: Section, peak: dict[str, float]) -> None:
    device = settings.device
    config = size.model
    dm = data_module(settings, size.data_vocab)
    batches = token_batches(dm, size.max_tokens, size.batches, seed=settings.seed, device=device)
    if config.vocab_size != size.data_vocab:
        batches = remap_vocabulary(batches, size.data_vocab, config.vocab_size)
    stats = batch_stats(batches)
    torch.manual_seed(settings.seed)
    models, notes = build_models(config, device)
    section.notes += [f"{size.name}: {n}" for n in notes]
    params = {name: trainable_parameters(m) for name, m in models.items()}
    # All three start from our weights and must compute the same function (dropout aside).
    load_into_torch(models["ours"], models["nn.Transformer"])
    if "Marian" in models:
        load_into_marian(models["ours"], models["Marian"])
    probe = batches[0]
    errors = {name: logits_error(models["ours"], model, probe["src"], probe["tgt_in"])
              for name, model in models.items() if name != "ours"}
    print(f"[train] {size.name}: same weights, max |Δlogits| vs ours: "
          + ", ".join(f"{k} {v:.1e}" for k, v in errors.items()), flush=True)
    for name, error in errors.items():
        if not error <= SAME_FUNCTION_TOLERANCE:
            raise RuntimeError(f"{name} does not compute our function at {size.name}: "
                               f"max |Δlogits| = {error:.3g} > {SAME_FUNCTION_TOLERANCE}")
    print(f"[train] {size.name}: parameters " + ", ".join(f"{k} {v:,}" for k, v in params.items())
          + f" (closed form {count_parameters(config):,}); {stats['batches']} batch(es), "
          f"{stats['tgt_tokens']:,} target tokens, padding {stats['padding_share']:.1%}",
          flush=True)
    steps = {name: make_step(model, config, settings) for name, model in models.items()}

    def pass_over(name: str, precision: str) -> Callable[[], None]:
        return lambda: [steps[name](batch, precision) for batch in batches]

    runs = {(name, p): settings.label(name, p) for p in settings.compared for name in models}
    times = alternate({label: pass_over(*run) for run, label in runs.items()},
                      settings.reps_or(size.reps), device,
                      warmup={label: (lambda n=run: steps[n[0]](batches[0], n[1])) for run, label in runs.items()})
    flops = sum(train_flops(config, batch) for batch in batches)
    tokens = {name: stats["tgt_tokens"] / median(t) for name, t in times.items()}
    result = {"batches": stats, "params": params, "times_s": times, "tokens_per_s": tokens,
              "max_abs_logit_error_vs_ours": errors,
              "config": vars(config).copy(), "flops_per_pass": flops}
    vs_fp32 = over_fp32({run: tokens[label] for run, label in runs.items()})
    for (name, p), label in runs.items():
        per_pass = median(times[label])
        achieved = flops / per_pass
        ratio = tokens[settings.label("ours", p)] / tokens[label] if name != "ours" else None
        section.rows.append({
            "size": size.name, "model": name, "precision": p, "params": params[name],
            "ms/step": 1000 * per_pass / len(batches), "tgt tokens/s": tokens[label],
            "ours/peer": ratio, "vs fp32": vs_fp32.get((name, p)), "spread": spread(times[label]),
            "TFLOP/s": achieved / 1e12, "of matmul": achieved / 1e12 / peak[p], "MFU": mfu(achieved, device)})
        if ratio is not None:
            section.target(settings.label(f"train step {size.name}: ours/{name}", p), ratio, f"≥ {TARGET_RATIO}",
                           ratio >= TARGET_RATIO)
            result[settings.label(f"ratio_vs_{name}", p)] = ratio
    if ("ours", "bf16") in vs_fp32:
        gain = vs_fp32["ours", "bf16"]
        section.target(f"train step {size.name}: ours bf16/fp32", gain, f"≥ {size.bf16_target}",
                       gain >= size.bf16_target)
    section.data[size.name] = result
    if len(set(params.values())) > 1:
        section.notes.append(f"{size.name}: parameter counts differ: {params}")
    models.clear()
    steps.clear()
    free_memory(device)
