"""End to end on a GPU: `ablate train` itself (real command, real corpus, real Trainer) vs the bare step.

    python -m benchmarks.end_to_end --device cuda --multi30k-dir DIR [--steps 200] [--out DIR]

Measures, in one process tree and one sitting:
- `ablate train` with `train.compile=false` and `=true` (and once more compiled, to show a warm
  compile cache): start-up (process start to step 1), first step (compilation), steady-state target
  tokens/s between log windows, MFU, the window-mean training losses of both paths;
- the bare step on the same batches (the module's `forward_loss`, fused Adam, bf16 autocast, no
  Lightning, no data loading, batches already on the device), eager and compiled, at the run's
  25K-token batches and at 4K-token batches;
- the harness's cost: `ablate train` steady tokens/s ÷ the bare step's, same compile setting.

Base dimensions (N 6, d_model 512, d_ff 2048, h 8) on Multi30k with an 8,000-piece BPE (Multi30k
cannot hold the paper's 37,000 pieces); MFU counts matmul FLOPs including the vocabulary
projection (`common.train_flops`) against the device's dense bf16 peak. Writes `end_to_end.json`
and `end_to_end.md` under `--out`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import REPO, mfu, peak_flops, train_flops
from lightning_modules.config import DataConfig, TrainConfig, TransformerConfig
from lightning_modules.data import TranslationDataModule, collate
from lightning_modules.data.batching import TokenBucketBatchSampler
from lightning_modules.run.io import atomic_write_json, atomic_write_text
from lightning_modules.translation import TranslationModule

BASE = {"n_layers": 6, "d_model": 512, "d_ff": 2048, "n_heads": 8}
BIG = {"n_layers": 6, "d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3}


def ablate_train(out: Path, data_dir: Path, steps: int, max_tokens: int, compile_: bool,
                 log_every: int, dims: dict[str, Any]) -> dict[str, Any]:
    """Run the real command; return its results.json plus wall time and the logged losses."""
    args = [sys.executable, "-m", "ablate", "train", "--out", str(out),
            "--data", "multi30k", "--data-dir", str(data_dir), "--max-steps", str(steps), "--no-wandb",
            *[f"model.{k}={v}" for k, v in dims.items()], "data.vocab_size=8000",
            f"data.max_tokens={max_tokens}", f"train.compile={str(compile_).lower()}",
            f"train.log_every_n_steps={log_every}", "train.val_check_interval=100000",
            "train.checkpoint_every=100000", "train.warmup_steps=4000", "train.progress_bar=false",
            "eval.decode_test=false", "eval.beam_size=1"]
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout)[-2000:], "wall_s": wall}
    results = json.loads((out / "results.json").read_text())
    with (out / "logs" / "metrics.csv").open() as f:
        losses = {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}
    return {**results, "wall_s": round(wall, 1), "losses": losses}


def epoch_batches(dm: TranslationDataModule, max_tokens: int) -> list[dict[str, Any]]:
    sampler = TokenBucketBatchSampler(dm.train_set.src_lengths, dm.train_set.tgt_lengths, max_tokens,
                                      shuffle=True, seed=1, num_replicas=1, rank=0,
                                      pad_multiple=dm.pad_multiple)
    return [collate([dm.train_set[i] for i in b], dm.pad_id, dm.pad_multiple)
            for b in sampler.global_batches()]


def flops_per_token(c: TransformerConfig, batches: list[dict[str, Any]]) -> float:
    return sum(train_flops(c, b) for b in batches) / sum(b["n_tokens"] for b in batches)


def bare_step(c: TransformerConfig, batches: list[dict[str, Any]], compile_: bool, reps: int,
              device: torch.device) -> dict[str, Any]:
    """tokens/s of forward_loss + backward + fused Adam on device-resident batches."""
    torch.manual_seed(0)
    module = TranslationModule.from_configs(c, TrainConfig()).to(device)
    if compile_:
        module.compile_step()
    opt = torch.optim.Adam(module.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)
    on_device = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in b.items()} for b in batches]

    def epoch() -> None:
        for b in on_device:
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss, _, n = module._forward_loss_fn(b["src"], b["tgt_in"], b["tgt_out"], c.label_smoothing)
            (loss / n.clamp(min=1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    epoch()  # warm-up: compiles, cuDNN plans
    torch.cuda.synchronize(device)
    warm = time.perf_counter() - start
    times = []
    for _ in range(reps):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        epoch()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    tokens = sum(b["n_tokens"] for b in batches)
    best = min(times)
    flops = sum(train_flops(c, b) for b in batches)
    return {"tokens_per_s": round(tokens / best), "s_per_step": round(best / len(batches), 5),
            "mfu": round(mfu(flops / best, device) or 0, 3), "warmup_s": round(warm, 1),
            "mean_tokens": round(tokens / len(batches)), "steps": len(batches)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.end_to_end", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--multi30k-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--work", type=Path, default=Path("/tmp/ablate-e2e"))
    p.add_argument("--budget-s", type=float, default=480, help="skip later parts past this")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        p.error("this benchmark needs a CUDA device")
    t0 = time.perf_counter()
    gpu, peak = peak_flops(device)
    report: dict[str, Any] = {"device": gpu, "peak_bf16_flops": peak, "torch": torch.__version__,
                              "steps": args.steps, "runs": {}, "bare": {}}
    out_json, out_md = args.out / "end_to_end.json", args.out / "end_to_end.md"
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        report["total_s"] = round(time.perf_counter() - t0, 1)
        atomic_write_json(out_json, report)
        atomic_write_text(out_md, render(report))
        print(json.dumps({k: v for k, v in report.items() if k != "runs"}, default=str)[-3000:], flush=True)

    plan = [("eager", False, BASE, args.steps), ("compiled", True, BASE, args.steps),
            ("compiled, warm cache", True, BASE, max(args.steps // 2, 2 * args.log_every + 1))]
    for name, comp, dims, steps in plan:
        run = ablate_train(args.work / name.replace(" ", "_").replace(",", ""), args.multi30k_dir,
                           steps, 25000, comp, args.log_every, dims)
        report["runs"][name] = run
        print(name, {k: run.get(k) for k in ("startup_s", "first_step_s", "steady_tokens_per_s",
                                              "compiled_graphs", "wall_s", "error")}, flush=True)
        save()

    # Bare steps on the same batches (the first run's BPE), then the harness's share.
    run_dir = args.work / "eager"
    c = TransformerConfig(**BASE, vocab_size=8000)
    dm = TranslationDataModule(DataConfig(corpus="multi30k", data_dir=str(args.multi30k_dir),
                                          vocab_size=8000, max_tokens=25000), run_dir,
                               pad_multiple=1)
    dm.setup("fit")
    for tokens in (25000, 4000):
        batches = epoch_batches(dm, tokens)[:24]
        report["flops_per_token"] = report.get("flops_per_token") or flops_per_token(c, epoch_batches(dm, 25000))
        for comp in (False, True):
            if time.perf_counter() - t0 > args.budget_s:
                break
            key = f"{'compiled' if comp else 'eager'} @ {tokens // 1000}K"
            report["bare"][key] = bare_step(c, batches, comp, 2, device)
            print(key, report["bare"][key], flush=True)
            save()
    if time.perf_counter() - t0 < args.budget_s:
        big = TransformerConfig(**BIG, vocab_size=8000)
        report["bare"]["big eager @ 25K"] = bare_step(big, epoch_batches(dm, 25000)[:12], False, 2, device)
        report["big_flops_per_token"] = flops_per_token(big, epoch_batches(dm, 25000))
        save()
    for run in report["runs"].values():
        if run.get("steady_tokens_per_s"):
            run["mfu"] = round(run["steady_tokens_per_s"] * report["flops_per_token"] / peak, 3)
    save()
    print(render(report))
    return 0


def render(r: dict[str, Any]) -> str:
    lines = [f"# End to end: `ablate train` vs the bare step ({r.get('device')}, torch {r.get('torch')})", "",
             "Base dims, Multi30k, BPE 8,000, 25K-token batches (lengths padded to multiples of 8), bf16.",
             "", "| run | start-up (s) | first step (s) | steady tok/s | MFU | graphs | wall (s) |",
             "|---|---|---|---|---|---|---|"]
    for name, run in r.get("runs", {}).items():
        if "error" in run:
            lines.append(f"| {name} | error: {run['error'][-200:]!r} | | | | | |")
            continue
        lines.append(f"| {name} | {run.get('startup_s')} | {run.get('first_step_s')} | "
                     f"{run.get('steady_tokens_per_s')} | {run.get('mfu', '')} | {run.get('compiled_graphs')} | "
                     f"{run.get('wall_s')} |")
    lines += ["", "| bare step | tok/s | s/step | MFU | mean tokens | warm-up (s) |", "|---|---|---|---|---|---|"]
    for name, b in r.get("bare", {}).items():
        lines.append(f"| {name} | {b['tokens_per_s']} | {b['s_per_step']} | {b['mfu']} | {b['mean_tokens']} | "
                     f"{b['warmup_s']} |")
    runs, bare = r.get("runs", {}), r.get("bare", {})
    for name, key in (("eager", "eager @ 25K"), ("compiled", "compiled @ 25K")):
        if runs.get(name, {}).get("steady_tokens_per_s") and key in bare:
            share = runs[name]["steady_tokens_per_s"] / bare[key]["tokens_per_s"]
            lines.append(f"\n`ablate train` {name} reaches {share:.1%} of the bare step's tokens/s.")
    a, b = runs.get("eager", {}).get("losses"), runs.get("compiled", {}).get("losses")
    if a and b:
        common = sorted(set(a) & set(b))
        diffs = [abs(a[s] - b[s]) / a[s] for s in common]
        lines.append(f"\nWindow-mean training loss, eager vs compiled, {len(common)} windows: max relative "
                     f"difference {max(diffs):.2%} (dropout masks differ between the two paths).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
