"""Benchmark 7 (opt-in: `--only reproducibility`): what changes a run's numbers besides its seed.

Issue 12: the same command and seed on two 2-core CPU machines gave base dev PPL 116.43 and
120.72 (demo preset). Two CPUs differ in the vector kernels ATen dispatches to (its CPU capability,
AVX-512, AVX2 or none: `ATEN_CPU_CAPABILITY` lowers it), in MKL's code path for matrix products
(`MKL_ENABLE_INSTRUCTIONS`), and in their core count, which is torch's default thread count and
decides how sums are split. Each is simulated here on one machine, one fresh process per setting:

1. Operations: every kind of operation in a training step, on fixed inputs; the outputs
   compared bit for bit with the reference setting's (largest relative difference).
2. Training: `ablate train --preset demo --row base` for N steps (one BPE model shared by all
   runs, so only the arithmetic differs), loss and gradient norm logged at every step: the first
   step whose loss differs in any bit from the reference's, the loss at step N, the dev perplexity.
3. The cost of `torch.use_deterministic_algorithms`: CPU time of the bare training step at demo
   dims with it off, on, and on without filling new tensors' memory, alternated.

    python -m benchmarks --only reproducibility --out benchmarks/results/reproducibility-cpu-DATE
    python -m benchmarks.reproducibility probe OUT.pt   # one setting's operations (internal)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.common import (REPO, Section, Settings, bare_step, data_module, median, share_bpe, stopwatch,
                               token_batches)
from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.metrics_log import logged


@dataclass(frozen=True)
class Setting:
    """A simulated machine: environment variables, torch threads, deterministic algorithms."""

    name: str
    env: dict[str, str] = field(default_factory=dict)
    threads: int = 2
    deterministic: bool = False
    reference: str = "reference"  # the setting it is compared with

    def describe(self) -> str:
        env = " ".join(f"{k}={v}" for k, v in self.env.items())
        return f"threads {self.threads}{', deterministic' if self.deterministic else ''}" + (f", {env}" if env else "")


# The demo preset's base row (ablations/presets/demo.yaml), for the bare step.
DEMO_DIMS, DEMO_VOCAB, DEMO_TOKENS = {"n_layers": 3, "d_model": 64, "d_ff": 256, "n_heads": 8}, 2000, 1500
AVX2_CPU = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
SETTINGS = [
    Setting("reference"),
    Setting("same again"),
    Setting("1 thread", threads=1),
    Setting("ATen AVX2 kernels", {"ATEN_CPU_CAPABILITY": "avx2"}),
    Setting("ATen scalar kernels", {"ATEN_CPU_CAPABILITY": "default"}),
    Setting("MKL AVX2 path", {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
    Setting("an AVX2 CPU", AVX2_CPU),
    Setting("deterministic algorithms", deterministic=True),
    Setting("MKL_CBWR=AVX2", {"MKL_CBWR": "AVX2"}),
    Setting("MKL_CBWR=AVX2 on an AVX2 CPU", {**AVX2_CPU, "MKL_CBWR": "AVX2"}, reference="MKL_CBWR=AVX2"),
]
TRAINED = ["reference", "same again", "1 thread", "ATen AVX2 kernels", "ATen scalar kernels", "MKL AVX2 path",
           "an AVX2 CPU", "deterministic algorithms"]


# ----------------------------------------------------------------------------------- 1. operations

def operations() -> dict[str, Tensor]:
    """The outputs of a training step's kinds of operation on fixed inputs (demo dims). Inputs come
    from numpy, so that they are the same under every setting; torch's own random initialisers
    are operations here."""
    rng = np.random.default_rng(0)
    randn = lambda *shape: torch.from_numpy(rng.standard_normal(shape, dtype=np.float32))  # noqa: E731
    rows, d, d_ff, vocab, heads, length = 768, 64, 256, 2000, 8, 24
    x, w, logits = randn(rows, d), (randn(d_ff, d) / 8).requires_grad_(), randn(rows, vocab) * 3
    q, k, v = (randn(rows // length, heads, length, d // heads).requires_grad_() for _ in range(3))
    attention = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    attention.backward(randn(*attention.shape))
    linear = F.linear(x, w)
    linear.backward(randn(*linear.shape))
    table = randn(vocab, d).requires_grad_()
    F.embedding(torch.from_numpy(rng.integers(0, vocab, rows)), table).sum().backward()
    param = torch.nn.Parameter(randn(d_ff, d))
    param.grad = randn(d_ff, d)
    t = TrainConfig()  # the paper's Adam
    adam = torch.optim.Adam([param], lr=1e-3, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps)
    for _ in range(3):
        adam.step()
    torch.manual_seed(0)
    initialised = {"normal init (embeddings)": torch.nn.init.normal_(torch.empty(vocab, d), std=d ** -0.5),
                   "xavier_uniform init (linear)": torch.nn.init.xavier_uniform_(torch.empty(d_ff, d)),
                   "dropout mask": F.dropout(torch.ones(rows, d), 0.1, training=True)}
    return {"matmul (linear)": linear.detach(), "matmul backward (weight grad)": w.grad,
            "sum over a dimension": logits.sum(0), "sum of everything": logits.sum().reshape(1),
            "exp": logits.exp(), "softmax": logits.softmax(-1), "log_softmax": logits.log_softmax(-1),
            "layer_norm": F.layer_norm(x, (d,)), "relu": F.relu(x),
            "attention (SDPA)": attention.detach(), "attention backward": q.grad,
            "embedding backward": table.grad, "Adam step": param.detach(), **initialised}


def probe(out: Path) -> None:
    """Run `operations` under this process's settings ($REPRO_THREADS, $REPRO_DETERMINISTIC)."""
    torch.set_num_threads(int(os.environ.get("REPRO_THREADS", "2")))
    torch.use_deterministic_algorithms(os.environ.get("REPRO_DETERMINISTIC") == "1", warn_only=True)
    torch.save({"capability": torch.backends.cpu.get_cpu_capability(), "outputs": operations()}, out)


def run_probe(setting: Setting, work: Path) -> dict[str, Any]:
    out = work / f"ops-{len(list(work.glob('ops-*')))}.pt"
    env = {**os.environ, **setting.env, "REPRO_THREADS": str(setting.threads),
           "REPRO_DETERMINISTIC": "1" if setting.deterministic else "0"}
    subprocess.run([sys.executable, "-m", "benchmarks.reproducibility", "probe", str(out)], env=env,
                   cwd=REPO, check=True)
    return torch.load(out)


def relative_difference(a: Tensor, b: Tensor) -> float:
    """max |a − b| / max |a|: 0.0 exactly when equal bit for bit (up to the sign of zero)."""
    return float((a - b).abs().max() / a.abs().max().clamp(min=1e-30))


def compare_operations(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per setting: which operations differ from its reference's, by how much."""
    rows = []
    for s in SETTINGS[1:]:
        mine, ref = results[s.name]["outputs"], results[s.reference]["outputs"]
        differ = {op: relative_difference(ref[op], mine[op]) for op in ref if not torch.equal(ref[op], mine[op])}
        rows.append({"setting": s.name, "compared with": s.reference, "as": s.describe(),
                     "ATen capability": results[s.name]["capability"],
                     "operations that differ (max relative difference)":
                         ", ".join(f"{op} ({d:.0e})" for op, d in differ.items()) or "none: identical"})
    return rows


# ----------------------------------------------------------------------------------- 2. training

def train_args(out: Path, steps: int, setting: Setting, quick: bool) -> list[str]:
    dims = ["d_model=32", "d_ff=64", "n_layers=1", "data.valid_size=100"] if quick else []
    return [sys.executable, "-m", "ablate", "train", "--preset", "demo", "--row", "base", "--out", str(out),
            "--max-steps", str(steps), "--seed", "1", "--no-wandb", *dims, "train.log_every_n_steps=1",
            "train.val_check_interval=100000", "train.checkpoint_every=100000", "train.progress_bar=false",
            "eval.beam_size=1", f"train.threads={setting.threads}",
            f"train.deterministic={str(setting.deterministic).lower()}"]


def train(setting: Setting, work: Path, steps: int, quick: bool, bpe: Path | None) -> dict[str, Any]:
    """`ablate train` under `setting`; its per-step losses, dev PPL, environment and speed."""
    out = work / setting.name.replace(" ", "-")
    out.mkdir()
    if bpe is not None:  # one BPE model for all runs: only the arithmetic differs
        share_bpe(bpe, out)
    proc = subprocess.run(train_args(out, steps, setting, quick), env={**os.environ, **setting.env}, cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{setting.name}: ablate train failed:\n{proc.stderr[-2000:]}")
    results = json.loads((out / "results.json").read_text())
    return {"loss": logged(out / "logs", "train/loss"), "grad_norm": logged(out / "logs", "train/grad_norm"),
            "ppl": results["ppl"], "environment": results["environment"],
            "steady_tokens_per_s": results["steady_tokens_per_s"], "bpe": out / "spm.model"}


def first_difference(a: dict[int, float], b: dict[int, float]) -> int | None:
    """The first step (counting from 1) whose value differs in any bit; None if none does."""
    return next((step + 1 for step in sorted(a) if a[step] != b.get(step)), None)


def compare_training(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per trained setting, against the reference run."""
    ref = runs["reference"]
    last = max(ref["loss"])
    return [{"setting": name, "as": setting(name).describe(),
             "loss differs from step": first_difference(ref["loss"], r["loss"]),
             "grad norm differs from step": first_difference(ref["grad_norm"], r["grad_norm"]),
             f"loss at step {last + 1}": r["loss"][last], "dev PPL": r["ppl"],
             "ΔPPL": r["ppl"] - ref["ppl"], "tokens/s": r["steady_tokens_per_s"]}
            for name, r in runs.items()]


def setting(name: str) -> Setting:
    return next(s for s in SETTINGS if s.name == name)


# ----------------------------------------------------------------------------------- 3. speed

DETERMINISTIC_MODES = {  # (use_deterministic_algorithms, fill_uninitialized_memory)
    "off": (False, True), "on": (True, True), "on, uninitialized memory not filled": (True, False)}


def set_deterministic(mode: str) -> None:
    algorithms, fill = DETERMINISTIC_MODES[mode]
    torch.use_deterministic_algorithms(algorithms, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = fill


def deterministic_cost(settings: Settings, bpe_dir: Path, blocks: int) -> dict[str, dict[str, float]]:
    """CPU seconds per bare training step at demo dims (one thread) in each of DETERMINISTIC_MODES:
    one model, the modes alternated every 4 steps, `blocks` blocks each; the median and the least.

    CPU time of one thread, not wall time: on a machine shared with other jobs, wall time measured
    the other jobs (two full runs of this benchmark gave -38% and +76% for the same change)."""
    torch.set_num_threads(1)
    dm = data_module(settings, DEMO_VOCAB, run_dir=bpe_dir, ding_dictionary=False)
    c = TransformerConfig(**DEMO_DIMS, vocab_size=dm.vocab_size, pad_id=dm.pad_id)
    step = bare_step(c, TrainConfig(), settings, lr=1e-4)[1]
    batches = token_batches(dm, DEMO_TOKENS, 16, settings.seed)
    for b in batches:  # warm-up
        step(b)
    seconds: dict[str, list[float]] = {mode: [] for mode in DETERMINISTIC_MODES}
    for i in range(blocks):
        for mode in list(seconds) if i % 2 == 0 else list(seconds)[::-1]:
            set_deterministic(mode)
            start = time.process_time()
            for b in batches[(4 * i) % 16:(4 * i) % 16 + 4]:
                step(b)
            seconds[mode].append((time.process_time() - start) / 4)
    set_deterministic("off")
    return {mode: {"median": median(s), "least": min(s)} for mode, s in seconds.items()}


def run(settings: Settings) -> Section:
    steps = 5 if settings.quick else 100
    section = Section("reproducibility", f"7. Reproducibility: {steps} steps of the demo base row under "
                      "simulated machines", ["setting", "as", "loss differs from step", "grad norm differs from step",
                                             f"loss at step {steps}", "dev PPL", "ΔPPL", "tokens/s"],
                      formats={f"loss at step {steps}": "{:.9f}", "dev PPL": "{:.3f}", "ΔPPL": "{:+.3f}"})
    with stopwatch(section), tempfile.TemporaryDirectory(prefix="ablate-repro-") as tmp:
        work = Path(tmp)
        ops = {s.name: run_probe(s, work) for s in SETTINGS}
        runs: dict[str, dict[str, Any]] = {}
        for name in TRAINED[:2] if settings.quick else TRAINED:
            runs[name] = train(setting(name), work, steps, settings.quick, runs["reference"]["bpe"] if runs else None)
        cost = deterministic_cost(settings, work / "reference", 4 if settings.quick else 40)
    section.rows = compare_training(runs)
    section.more.append(Section("reproducibility_operations", "7b. Operations of a training step, bit for bit",
                                ["setting", "compared with", "as", "ATen capability",
                                 "operations that differ (max relative difference)"],
                                rows=compare_operations(ops)))
    section.data = {"losses": {n: r["loss"] for n, r in runs.items()},
                    "environments": {n: r["environment"] for n, r in runs.items()},
                    "deterministic_cpu_s_per_step": cost}
    off = cost["off"]["median"]
    section.notes.append("tokens/s: wall-clock speed of each run, on a machine shared with other jobs (noise, "
                         "not a property of the setting)")
    section.notes.append("bare training step at demo dims, CPU ms per step (one thread; median, least), "
                         "deterministic algorithms " + "; ".join(
                             f"{mode}: {1000 * c['median']:.1f}, {1000 * c['least']:.1f} ({c['median'] / off - 1:+.1%})"
                             for mode, c in cost.items()))
    return section


if __name__ == "__main__":
    if sys.argv[1:2] == ["probe"]:
        probe(Path(sys.argv[2]))
