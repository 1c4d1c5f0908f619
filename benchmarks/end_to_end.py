"""Benchmark 6: `ablate train` end to end (the real command, corpus and Trainer) vs the bare step.

Runs `ablate train` as a subprocess with `train.compile=false` and `=true` (and once more compiled,
to show what a warm compile cache leaves of the compilation), and reads back from its results.json
what the run measured itself: start-up (process start to the first step), the first step's time
(which holds the compilation), steady-state target tokens/s between log windows, graphs compiled.
Then the bare step on the same batches: the module's `forward_loss`, backward and Adam (fused on
CUDA), batches already on the device, no Lightning, no data loading; eager and compiled, at the
run's batch size and at a small one. The harness's cost is `ablate train` ÷ bare, same setting.

Sizes: on CUDA base dims (N 6, d_model 512, d_ff 2048, h 8) on Multi30k (`--multi30k-dir`; BPE
8,000 pieces: Multi30k cannot hold the paper's 37,000) at 25K and 4K tokens; on CPU demo dims
(N 3, d_model 64, d_ff 256, h 8) on Ding at 1,500 and 400 tokens. MFU (CUDA) counts matmul FLOPs
including the vocabulary projection (`common.train_flops`) against the device's bf16 peak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (REPO, Section, Settings, data_module, logged_values, mfu, stopwatch, sync,
                               token_batches, train_flops)
from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.translation import TranslationModule

TARGET_MFU = 0.40
TARGET_HARNESS_SHARE = 0.90
TARGET_STARTUP_S = 15.0


def _plan(settings: Settings) -> dict[str, Any]:
    if settings.device.type == "cuda":
        return {"dims": {"n_layers": 6, "d_model": 512, "d_ff": 2048, "n_heads": 8}, "vocab": 8000,
                "corpus": "multi30k", "tokens": (25000, 4000), "steps": 200, "log_every": 20}
    if settings.quick:
        return {"dims": {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 4}, "vocab": 500,
                "corpus": "ding", "tokens": (1500, 400), "steps": 24, "log_every": 4}
    return {"dims": {"n_layers": 3, "d_model": 64, "d_ff": 256, "n_heads": 8}, "vocab": 2000,
            "corpus": "ding", "tokens": (1500, 400), "steps": 200, "log_every": 20}


def ablate_train(out: Path, plan: dict[str, Any], settings: Settings, compile_: bool,
                 steps: int) -> dict[str, Any]:
    """Run the real command; its results.json plus wall time and the logged window losses."""
    corpus = ["--data", "multi30k", "--data-dir", str(settings.multi30k_dir)] \
        if plan["corpus"] == "multi30k" else ["data.ding_dictionary=false"]
    args = [sys.executable, "-m", "ablate", "train", "--out", str(out), *corpus,
            "--max-steps", str(steps), "--no-wandb", "--seed", str(settings.seed),
            "--accelerator", "gpu" if settings.device.type == "cuda" else "cpu",
            *[f"model.{k}={v}" for k, v in plan["dims"].items()], f"data.vocab_size={plan['vocab']}",
            f"data.max_tokens={plan['tokens'][0]}", f"train.compile={str(compile_).lower()}",
            f"train.log_every_n_steps={plan['log_every']}", "train.val_check_interval=100000",
            "train.checkpoint_every=100000", "train.warmup_steps=4000", "train.progress_bar=false",
            "eval.decode_test=false", "eval.beam_size=1"]
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:], "wall_s": wall}
    results = json.loads((out / "results.json").read_text())
    return {**results, "wall_s": round(wall, 1), "losses": logged_values(out, "train/loss")}


def flops_per_token(c: TransformerConfig, batches: list[dict[str, Any]]) -> float:
    return sum(train_flops(c, b) for b in batches) / sum(b["n_tokens"] for b in batches)


def train_step(c: TransformerConfig, compile_: bool, settings: Settings) -> Callable[[dict[str, Any]], None]:
    """One bare training step (forward_loss, backward, Adam) of a fresh model, as a function of a
    batch already on the device."""
    device = settings.device
    torch.manual_seed(settings.seed)
    module = TranslationModule.from_configs(c, TrainConfig()).to(device)
    if compile_:
        module.compile_step()
    opt = torch.optim.Adam(module.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9,
                           fused=True if device.type == "cuda" else None)

    def step(b: dict[str, Any]) -> None:
        with settings.autocast():
            loss, _, n = module._forward_loss_fn(b["src"], b["tgt_in"], b["tgt_out"], c.label_smoothing)
        (loss / n.clamp(min=1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bare_step(c: TransformerConfig, batches: list[dict[str, Any]], compile_: bool, reps: int,
              settings: Settings) -> dict[str, Any]:
    """tokens/s of forward_loss + backward + Adam on batches already on the device."""
    device = settings.device
    step = train_step(c, compile_, settings)
    on_device = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in b.items()} for b in batches]

    def epoch() -> None:
        for b in on_device:
            step(b)

    start = time.perf_counter()
    epoch()  # warm-up: compilation, cuDNN plans, allocator
    sync(device)
    warm = time.perf_counter() - start
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        epoch()
        sync(device)
        times.append(time.perf_counter() - start)
    tokens, best = sum(b["n_tokens"] for b in batches), min(times)
    return {"tokens_per_s": tokens / best, "ms_per_step": 1000 * best / len(batches),
            "mfu": mfu(sum(train_flops(c, b) for b in batches) / best, device),
            "warmup_s": warm, "mean_tokens": tokens / len(batches)}


def run(settings: Settings) -> Section:
    section = Section("end_to_end", "6. End to end: `ablate train` vs the bare step",
                      ["what", "compiled", "tokens/batch", "start-up s", "first step s", "tokens/s",
                       "MFU", "graphs", "of bare", "wall s"],
                      formats={"of bare": "{:.1%}", "MFU": "{:.1%}"})
    plan = _plan(settings)
    if plan["corpus"] == "multi30k" and not (settings.multi30k_dir and settings.multi30k_dir.is_dir()):
        section.notes.append(f"skipped: no Multi30k at {settings.multi30k_dir} (--multi30k-dir)")
        return section
    c = TransformerConfig(**plan["dims"], vocab_size=plan["vocab"])
    big_tokens, small_tokens = plan["tokens"]
    reps = settings.reps_or(2)
    with stopwatch(section), tempfile.TemporaryDirectory(prefix="ablate-e2e-") as work:
        runs: dict[str, dict[str, Any]] = {}
        for name, comp, steps in (("eager", False, plan["steps"]), ("compiled", True, plan["steps"]),
                                  ("compiled, warm cache", True, plan["steps"] // 2)):
            runs[name] = ablate_train(Path(work) / name.replace(", ", "-").replace(" ", "-"), plan,
                                      settings, comp, steps)
        data_kw = {"data_dir": str(settings.multi30k_dir)} if plan["corpus"] == "multi30k" else {
            "ding_dictionary": False}
        dm = data_module(settings, plan["vocab"], plan["corpus"], run_dir=Path(work) / "eager", **data_kw)
        per_token = flops_per_token(c, token_batches(dm, big_tokens, None, settings.seed))
        bare: dict[tuple[bool, int], dict[str, Any]] = {}
        for tokens in (big_tokens, small_tokens):
            batches = token_batches(dm, tokens, 8 if settings.quick else 24, settings.seed)
            for comp in (False, True):
                bare[comp, tokens] = bare_step(c, batches, comp, reps, settings)
    for name, r in runs.items():
        comp = r.get("compiled", name != "eager")
        steady = r.get("steady_tokens_per_s")
        base = bare.get((comp, big_tokens), {}).get("tokens_per_s")
        section.rows.append({
            "what": f"ablate train ({name})" + (f": {r['error']}" if "error" in r else ""),
            "compiled": comp, "tokens/batch": big_tokens, "start-up s": r.get("startup_s"),
            "first step s": r.get("first_step_s"), "tokens/s": steady,
            "MFU": mfu(steady * per_token, settings.device) if steady else None,
            "graphs": r.get("compiled_graphs"), "of bare": steady / base if steady and base else None,
            "wall s": r.get("wall_s")})
    for (comp, tokens), b in bare.items():
        section.rows.append({"what": "bare step", "compiled": comp, "tokens/batch": tokens,
                             "first step s": None, "tokens/s": b["tokens_per_s"], "MFU": b["mfu"],
                             "wall s": round(b["warmup_s"], 1)})
    eager_run, compiled_run = runs.get("eager", {}), runs.get("compiled", {})
    best = max((r.get("steady_tokens_per_s") or 0, r.get("compiled")) for r in (eager_run, compiled_run))
    if settings.device.type == "cuda":
        value = mfu(best[0] * per_token, settings.device)
        section.target("ablate train steady-state MFU (best of eager/compiled)", value,
                       f"≥ {TARGET_MFU:.0%}", None if value is None else value >= TARGET_MFU)
        startup = eager_run.get("startup_s")
        section.target("start-up: process start to step 1 (s)", startup, f"≤ {TARGET_STARTUP_S:.0f} s",
                       None if startup is None else startup <= TARGET_STARTUP_S)
    for name, r in (("eager", eager_run), ("compiled", compiled_run)):
        base = bare.get((name == "compiled", big_tokens), {}).get("tokens_per_s")
        if r.get("steady_tokens_per_s") and base:
            share = r["steady_tokens_per_s"] / base
            section.target(f"ablate train ({name}) ÷ bare step", share, f"≥ {TARGET_HARNESS_SHARE:.0%}",
                           share >= TARGET_HARNESS_SHARE)
    a, b = eager_run.get("losses"), compiled_run.get("losses")
    if a and b:
        common = sorted(set(a) & set(b))
        worst = max(abs(a[s] - b[s]) / a[s] for s in common)
        section.notes.append(f"Window-mean training loss, eager vs compiled, {len(common)} windows of "
                             f"{plan['log_every']} steps: max relative difference {worst:.2%} (dropout "
                             "masks differ between the two paths; tests/test_step_speed.py checks "
                             "equal losses without dropout).")
    section.notes += [
        f"{'Base' if settings.device.type == 'cuda' else 'Demo'} dims {plan['dims']}, corpus "
        f"{plan['corpus']}, BPE {plan['vocab']:,}; `ablate train` {plan['steps']} steps "
        f"({plan['steps'] // 2} for the warm-cache run), steady state measured from its second log "
        f"window to its last. FLOPs per target token {per_token / 1e6:.1f} M.",
        "start-up = process start to the first training step (data, BPE, model, Trainer); the "
        "first step holds torch.compile's compilation. 'of bare' = steady tokens/s ÷ the bare "
        "step's at the same batch size and compile setting.",
    ]
    section.data = {"runs": {k: {kk: vv for kk, vv in v.items() if kk != "data"} for k, v in runs.items()},
                    "bare": {f"{'compiled' if k[0] else 'eager'}@{k[1]}": v for k, v in bare.items()},
                    "flops_per_token": per_token, "plan": plan}
    return section
