"""Benchmark 6: `ablate train` end to end (the real command, corpus and Trainer) vs the bare step.

Runs `ablate train` as a subprocess with `train.compile=false` and `=true` (and once more compiled,
to show what a warm compile cache leaves of the compilation), and reads back from its results.json
what the run measured itself: start-up (process start to the first step), the first step's time
(which holds the compilation), steady-state target tokens/s between log windows, graphs compiled.
Then the bare step on the same batches: the module's `forward_loss`, backward and Adam (fused on
CUDA), batches already on the device, no Lightning, no data loading; eager and compiled, at the
run's batch size and at a small one. The harness's cost is `ablate train` ÷ bare, same setting.

Cases (`--cases`): on CUDA `wmt-base-37k` (the issue's target: base dims, the paper's 37,000
BPE, WMT-length sentences from newstest2013+2014, `--newstest-dir`) at 25K and 4K tokens,
`wmt-big-37k` (the big row), and `multi30k-base-8k` (short sentences, BPE 8,000, the earlier
setting); on CPU demo dims (N 3, d_model 64, d_ff 256, h 8) on Ding at 1,500 and 400 tokens. MFU
(CUDA) counts matmul FLOPs including the vocabulary projection (`common.train_flops`) against the
device's bf16 peak. Each measurement also prints one JSON line as it finishes. With `--precision
fp32,bf16` each run and bare step is measured in each precision (`ablate train --precision 32-true`
or `bf16-mixed`), one after the other in one process; `vs fp32` is tokens/s over fp32's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.common import (BASE, BIG, LIGHTNING_PRECISION, REPO, TINY, Case, Section, Settings, alternate,
                               bare_step, data_module, mfu, on_device, over_fp32, stopwatch, sync, token_batches,
                               train_flops)
from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.metrics_log import logged

TARGET_MFU = 0.40
TARGET_HARNESS_SHARE = 0.90
TARGET_STARTUP_S = 15.0


NEWSTEST_REPEAT = 8  # newstest2013+2014 repeated: ~48K pairs, ~50 steps of 25K tokens an epoch


CUDA_CASES = [
    # The target: base dims, the paper's 37,000 vocabulary, WMT-length sentences.
    Case("wmt-base-37k", BASE, 37000, (25000, 4000), corpus="newstest", steps=200, log_every=20),
    Case("wmt-big-37k", BIG, 37000, (25000,), corpus="newstest", steps=150, log_every=15),
    # The earlier setting (short Multi30k sentences, BPE 8,000), kept for comparison.
    Case("multi30k-base-8k", BASE, 8000, (25000, 4000), corpus="multi30k", steps=200, log_every=20,
         warm_cache=True),
]
QUICK_CASE = Case("quick", TINY, 500, (1500, 400), corpus="ding", steps=24, log_every=4)
DEMO_CASE = Case("demo", {"n_layers": 3, "d_model": 64, "d_ff": 256, "n_heads": 8}, 2000, (1500, 400),
                 corpus="ding", steps=200, log_every=20, warm_cache=True)
CASE_NAMES = [c.name for c in (*CUDA_CASES, QUICK_CASE, DEMO_CASE)]
RUNS = ("eager", "compiled", "compiled, warm cache")  # what --steps may name after a case: CASE:RUN


def _cases(settings: Settings) -> list[Case]:
    """Each an end-to-end comparison: `ablate train` eager and compiled vs the bare step."""
    if settings.device.type == "cuda":
        return CUDA_CASES
    return [QUICK_CASE] if settings.quick else [DEMO_CASE]


def newstest_files(newstest_dir: Path, work: Path) -> dict[str, str]:
    """`--data files` settings for a WMT-length training text: newstest2013 and newstest2014
    repeated NEWSTEST_REPEAT times (for throughput only: the dev set is in it), newstest2013 as dev.

    WMT14's training data is not on machines without internet; its sentences (~25 words) are
    twice Multi30k's, which decides attention shapes and padding, and it holds the paper's
    37,000-piece BPE, which Multi30k cannot.
    """
    work.mkdir(parents=True, exist_ok=True)
    files = {}
    for side, lang in (("src", "en"), ("tgt", "de")):
        text = "".join((newstest_dir / f"newstest{year}.{lang}").read_text(encoding="utf-8")
                       for year in (2013, 2014))
        (work / f"train.{lang}").write_text(text * NEWSTEST_REPEAT, encoding="utf-8")
        files |= {f"train_{side}": str(work / f"train.{lang}"), f"valid_{side}": str(newstest_dir / f"newstest2013.{lang}")}
    return files


def _corpus(case: Case, settings: Settings, work: Path) -> tuple[str, dict[str, Any]] | str:
    """The case's `--data` corpus and its other DataConfig fields, or why it cannot run here."""
    if case.corpus == "multi30k":
        if not (settings.multi30k_dir and settings.multi30k_dir.is_dir()):
            return f"no Multi30k at {settings.multi30k_dir} (--multi30k-dir)"
        return "multi30k", {"data_dir": str(settings.multi30k_dir)}
    if case.corpus == "newstest":
        if not (settings.newstest_dir and (settings.newstest_dir / "newstest2013.en").is_file()):
            return f"no newstest2013/2014 at {settings.newstest_dir} (--newstest-dir)"
        return "files", newstest_files(settings.newstest_dir, work / "newstest")
    return "ding", {"ding_dictionary": False}


def ablate_train(out: Path, case: Case, corpus: str, fields: dict[str, Any], settings: Settings,
                 compile_: bool, steps: int) -> dict[str, Any]:
    """Run the real command; its results.json plus wall time and the logged window losses."""
    args = [sys.executable, "-m", "ablate", "train", "--out", str(out), "--data", corpus,
            *[f"data.{k}={v}" for k, v in fields.items()], "--max-steps", str(steps), "--no-wandb", "--seed", str(settings.seed),
            "--accelerator", "gpu" if settings.device.type == "cuda" else "cpu",
            "--precision", LIGHTNING_PRECISION[settings.precision],
            *[f"model.{k}={v}" for k, v in case.dims.items()], f"data.vocab_size={case.vocab}",
            f"data.max_tokens={case.tokens[0]}", f"train.compile={str(compile_).lower()}",
            f"train.log_every_n_steps={case.log_every}", "train.val_check_interval=100000",
            "train.checkpoint_every=100000", "train.warmup_steps=4000", "train.progress_bar=false",
            "eval.decode_test=false", "eval.beam_size=1"]
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:], "wall_s": wall}
    results = json.loads((out / "results.json").read_text())
    return {**results, "wall_s": round(wall, 1), "losses": logged(out / "logs", "train/loss")}


def flops_per_token(c: TransformerConfig, batches: list[dict[str, Any]]) -> float:
    return sum(train_flops(c, b) for b in batches) / sum(b["n_tokens"] for b in batches)


def bare_throughput(c: TransformerConfig, batches: list[dict[str, Any]], compile_: bool, reps: int,
                    settings: Settings) -> dict[str, Any]:
    """tokens/s of the bare step (`common.bare_step`: forward_loss + backward + Adam) of a fresh
    model on batches already on the device, the best of `reps` passes after a warm-up pass."""
    device = settings.device
    step = bare_step(c, TrainConfig(compile=compile_), settings, lr=1e-4)[1]
    moved = [on_device(b, device) for b in batches]

    def epoch() -> None:
        for b in moved:
            step(b)

    start = time.perf_counter()
    epoch()  # warm-up: compilation, cuDNN plans, allocator
    sync(device)
    warm = time.perf_counter() - start
    times = alternate({"epoch": epoch}, reps, device, warmup={"epoch": lambda: None})["epoch"]
    tokens, best = sum(b["n_tokens"] for b in batches), min(times)
    return {"tokens_per_s": tokens / best, "ms_per_step": 1000 * best / len(batches),
            "mfu": mfu(sum(train_flops(c, b) for b in batches) / best, device),
            "warmup_s": warm, "mean_tokens": tokens / len(batches)}


def _progress(case: Case, what: str, result: dict[str, Any]) -> None:
    """One JSON line per measurement as it finishes, so a run cut off by a time limit still
    leaves what it measured in its log."""
    keep = {k: v for k, v in result.items() if k not in ("losses", "data", "environment", "config")}
    print(json.dumps({"case": case.name, "what": what, **keep}, default=str), flush=True)


def run_case(case: Case, settings: Settings, work: Path, section: Section) -> dict[str, Any]:
    data = _corpus(case, settings, work)
    if isinstance(data, str):
        section.notes.append(f"{case.name} skipped: {data}")
        return {}
    corpus, fields = data
    reps = settings.reps_or(2)
    runs: dict[str, dict[str, Any]] = {}
    plan = [("eager", False, case.steps), ("compiled", True, case.steps)]
    if case.warm_cache or (case.name, "compiled, warm cache") in settings.steps:
        plan.append(("compiled, warm cache", True, case.steps // 2))
    if settings.steps:  # --steps: only the runs named, and the bare step at the case's first batch size only,
        # compiled as they are (the GPU session's end-to-end figure beside its bare step, in one call's time)
        plan = [p for p in plan if (case.name, p[0]) in settings.steps]
    plan = [(settings.label(name, p), name, comp, steps, p) for p in settings.compared for name, comp, steps in plan]
    folders = {name: work / case.name / name.replace(", ", "-").replace(" ", "-") for name, *_ in plan}
    for name, _, comp, steps, p in plan:
        runs[name] = ablate_train(folders[name], case, corpus, fields, replace(settings, precision=p), comp, steps)
        _progress(case, f"ablate train ({name})", runs[name])
    # the BPE of the first run (a run's own; `run` keeps only the cases --steps names, so there is one)
    dm = data_module(settings, case.vocab, corpus, run_dir=folders[plan[0][0]], **fields)
    c = TransformerConfig(**case.dims, vocab_size=dm.vocab_size, pad_id=dm.pad_id)
    per_token = flops_per_token(c, token_batches(dm, case.tokens[0], None, settings.seed))
    bare: dict[tuple[bool, int, str], dict[str, Any]] = {}
    for tokens in case.tokens[:1] if settings.steps else case.tokens:
        batches = token_batches(dm, tokens, 8 if settings.quick else 24, settings.seed)
        for comp in sorted({c for _, _, c, _, _ in plan}) if settings.steps else (False, True):
            for p in settings.compared:
                bare[comp, tokens, p] = bare_throughput(c, batches, comp, reps, replace(settings, precision=p))
                _progress(case, settings.label(f"bare step ({'compiled' if comp else 'eager'}, {tokens} tokens)", p),
                          bare[comp, tokens, p])
    big_tokens = case.tokens[0]
    first = settings.precision  # the targets' runs
    vs_fp32 = over_fp32({(run, p): runs[name]["steady_tokens_per_s"] for name, run, _, _, p in plan
                         if runs[name].get("steady_tokens_per_s")})
    vs_fp32 |= over_fp32({((comp, tokens), p): b["tokens_per_s"] for (comp, tokens, p), b in bare.items()})
    for name, run, comp, _, p in plan:
        r = runs[name]
        steady = r.get("steady_tokens_per_s")
        base = bare.get((comp, big_tokens, p), {}).get("tokens_per_s")
        section.rows.append({
            "case": case.name, "what": f"ablate train ({name})" + (f": {r['error']}" if "error" in r else ""),
            "compiled": comp, "tokens/batch": big_tokens, "start-up s": r.get("startup_s"),
            "first step s": r.get("first_step_s"), "tokens/s": steady,
            "MFU": mfu(steady * per_token, settings.device) if steady else None,
            "graphs": r.get("compiled_graphs"), "of bare": steady / base if steady and base else None,
            "vs fp32": vs_fp32.get((run, p)), "wall s": r.get("wall_s")})
    for (comp, tokens, p), b in bare.items():
        section.rows.append({"case": case.name, "what": settings.label("bare step", p), "compiled": comp,
                             "tokens/batch": tokens, "first step s": None, "tokens/s": b["tokens_per_s"], "MFU": b["mfu"],
                             "vs fp32": vs_fp32.get(((comp, tokens), p)), "wall s": round(b["warmup_s"], 1)})
    eager_run, compiled_run = runs.get(settings.label("eager", first), {}), runs.get(settings.label("compiled", first), {})
    if settings.device.type == "cuda":
        best = max(r.get("steady_tokens_per_s") or 0 for r in (eager_run, compiled_run))
        value = mfu(best * per_token, settings.device) if best else None
        section.target(f"{case.name}: ablate train steady-state MFU (best of eager/compiled)", value,
                       f"≥ {TARGET_MFU:.0%}", None if value is None else value >= TARGET_MFU)
        startup = eager_run.get("startup_s")
        section.target(f"{case.name}: start-up, process start to step 1 (s)", startup,
                       f"≤ {TARGET_STARTUP_S:.0f} s", None if startup is None else startup <= TARGET_STARTUP_S)
        for tokens in case.tokens[1:]:
            small = bare.get((True, tokens, first))
            if small:  # a small batch's step against its FLOP time at the device's peak
                ratio = small["mfu"] and 1 / small["mfu"]
                section.target(f"{case.name}: bare compiled step at {tokens} tokens ÷ its FLOP time", ratio,
                               "≤ 2×", None if ratio is None else ratio <= 2)
    for name, r in (("eager", eager_run), ("compiled", compiled_run)):
        base = bare.get((name == "compiled", big_tokens, first), {}).get("tokens_per_s")
        if r.get("steady_tokens_per_s") and base:
            share = r["steady_tokens_per_s"] / base
            section.target(f"{case.name}: ablate train ({name}) ÷ bare step", share,
                           f"≥ {TARGET_HARNESS_SHARE:.0%}", share >= TARGET_HARNESS_SHARE)
    a, b = eager_run.get("losses"), compiled_run.get("losses")
    if a and b:
        common = sorted(set(a) & set(b))
        worst = max(abs(a[s] - b[s]) / a[s] for s in common)
        section.notes.append(f"{case.name}: window-mean training loss, eager vs compiled, {len(common)} "
                             f"windows of {case.log_every} steps: max relative difference {worst:.2%} "
                             "(dropout masks differ between the two paths; tests/test_step_speed.py "
                             "checks equal losses without dropout).")
    section.notes.append(
        f"{case.name}: dims {case.dims}, corpus {case.corpus}, BPE {dm.vocab_size:,}; `ablate train` "
        f"{case.steps} steps" + (f" ({case.steps // 2} for the warm-cache run)" if case.warm_cache else "")
        + f"; FLOPs per target token {per_token / 1e6:.1f} M.")
    return {"runs": {k: {kk: vv for kk, vv in v.items() if kk != "data"} for k, v in runs.items()},
            "bare": {settings.label(f"{'compiled' if k[0] else 'eager'}@{k[1]}", k[2]): v for k, v in bare.items()},
            "flops_per_token": per_token, "case": case.__dict__}


def run(settings: Settings) -> Section:
    section = Section("end_to_end", "6. End to end: `ablate train` vs the bare step",
                      ["case", "what", "compiled", "tokens/batch", "start-up s", "first step s", "tokens/s",
                       "MFU", "graphs", "of bare", "vs fp32", "wall s"],
                      formats={"of bare": "{:.1%}", "MFU": "{:.1%}"})
    cases = [c for c in _cases(settings) if (not settings.cases or c.name in settings.cases)
             and (not settings.steps or c.name in {name for name, _ in settings.steps})]
    with stopwatch(section), tempfile.TemporaryDirectory(prefix="ablate-e2e-") as work:
        section.data = {case.name: run_case(case, settings, Path(work), section) for case in cases}
    section.notes += [
        "Steady state is measured from a run's second log window to its last. start-up = process "
        "start to the first training step (data, BPE, model, Trainer); the first step holds "
        "torch.compile's compilation. 'of bare' = steady tokens/s ÷ the bare step's at the same "
        "batch size and compile setting (the bare step: forward_loss, backward, Adam on batches "
        "already on the device; no Lightning, no data loading).",
        "newstest: newstest2013+2014 repeated as training text, for throughput only (WMT14's "
        "training data is not on machines without internet); its sentences have WMT's lengths and "
        "it holds the paper's 37,000-piece BPE.",
    ]
    return section
