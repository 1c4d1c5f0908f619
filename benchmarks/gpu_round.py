"""Benchmark: the GPU round (issue #40), every kernel variant of the training step side by side.

    python -m benchmarks --device cuda --only gpu_round --out DIR   # one H100/H200, < 8 minutes
    python -m benchmarks --only gpu_round --quick                   # CPU smoke check, tiny dims

What it reports, the variants' order and the budget: docs/gpu-performance.md ("The GPU round").
Method: every variant in `VARIANTS` runs in one process on the same batches (random Zipf ids with
WMT14-like lengths, one source width divisible by 8 and one not, so that a compiled guard on it shows
as a second graph) from the same weights. A warm-up pass (two compiled: CUDA graphs record a shape
on its second call) is timed apart, its first `AGREE_STEPS` losses compared with the `reference`'s
(`NOISE_FLOOR`: the dropout masks' noise); then `Case.passes` passes per batch size, timed by CUDA
events, a step over `SLOW_STEP` × the median (a recompilation) left out. A variant that does not fit
the budget (`_estimate`) or fails is a row saying so; `ISOLATED` ones run in a process of their own."""

from __future__ import annotations

import faulthandler
import json
import multiprocessing
import re
import signal
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchmarks.common import (BASE, BIG, TINY, Case, Section, Settings, bare_step, error_line, free_memory, mfu, on_device,
                               seeded, stopwatch, sync, train_flops)
from lightning_modules.compiling import compiled_graphs, recompile_reasons
from lightning_modules.config import TrainConfig, TransformerConfig
from lightning_modules.data.batching import ShapeBuckets, TokenBucketBatchSampler, collate
from foundation.io import atomic_write_text
from lightning_modules.translation import TranslationModule

COMPILED = {"train.compile": True}
# name -> config overrides ("model.KEY" / "train.KEY"); add a variant here in one line.
VARIANTS: dict[str, dict[str, Any]] = {
    "eager": {},
    "eager, other dropout seed": {},  # NOISE_FLOOR: the loss agreement's noise (see `_seed`)
    "eager, attention flash": {"model.attention_backend": "flash"},
    "eager, attention efficient": {"model.attention_backend": "efficient"},
    "eager, attention cudnn": {"model.attention_backend": "cudnn"},
    "eager, attention math": {"model.attention_backend": "math"},
    "eager, fused QKV": {"model.fused_qkv": True},
    "eager, loss chunks 8": {"train.loss_chunks": 8},
    "compiled": COMPILED,
    "compiled, loss chunks 8": {**COMPILED, "train.loss_chunks": 8},
    "compiled, attention flash": {**COMPILED, "model.attention_backend": "flash"},
    "compiled, attention cudnn": {**COMPILED, "model.attention_backend": "cudnn"},
    "compiled, attention efficient": {**COMPILED, "model.attention_backend": "efficient"},
    "compiled, fused QKV": {**COMPILED, "model.fused_qkv": True},
    "compiled, residual bf16": {**COMPILED, "model.residual_bf16": True},  # the norm/dropout/residual kernels' bytes
    # Inductor's Triton matmul templates, autotuned, with bias, dropout and the residual add fused into their epilogues
    "compiled, max-autotune": {**COMPILED, "train.compile_mode": "max-autotune-no-cudagraphs"},
    "compiled, all: flash, fused QKV, loss chunks 8": {**COMPILED, "model.attention_backend": "flash",
                                                      "model.fused_qkv": True, "train.loss_chunks": 8},
    # static shapes (data.shape_buckets: other batches, compared with "eager, buckets 8") and CUDA graphs
    "eager, buckets 8": {"data.shape_buckets": 8},
    "compiled, buckets 8": {**COMPILED, "data.shape_buckets": 8},
    "compiled, buckets 8, CUDA graphs": {**COMPILED, "data.shape_buckets": 8, "train.compile_mode": "reduce-overhead"},
}
NOISE_FLOOR = "eager, other dropout seed"  # the eager default with other dropout masks: not judged


ALL = "compiled, all: flash, fused QKV, loss chunks 8"
CASES = {"wmt-base-37k": Case("wmt-base-37k", BASE, 37000, (25000, 4000)),
         "wmt-big-37k": Case("wmt-big-37k", BIG, 37000, (25000, 4000)),
         "tiny": Case("tiny", TINY, 500, (600, 300), max_len=60, pool=3000, batches=3, passes=2)}
_EAGER = [name for name, overrides in VARIANTS.items() if not overrides.get("train.compile")]
BUCKETS = "compiled, buckets 8, CUDA graphs"
# In a process of their own (`measure_apart`): CUDA graphs have ended the process with no Python error
# (the GPU round's results page), so they run last too; max-autotune may overrun the budget.
ISOLATED = frozenset({BUCKETS, "compiled, max-autotune"})
ISOLATION_S = 20.0  # that process's imports and its case's weights and batches, added to its estimate
# (case, variant) in the order they run on CUDA: baselines and main suspects first, the cheap eager
# ones, big, then each knob compiled alone; a variant not placed here runs before CUDA graphs.
CUDA_PLAN = [("wmt-base-37k", name) for name in ("eager", "compiled", ALL, "compiled, residual bf16", *_EAGER[1:],
                                                 "compiled, loss chunks 8")] \
    + [("wmt-big-37k", name) for name in ("eager", "compiled", ALL)] \
    + [("wmt-base-37k", name) for name in ("compiled, buckets 8", "compiled, attention flash",
                                           "compiled, attention cudnn", "compiled, fused QKV",
                                           "compiled, attention efficient")] \
    + [("wmt-big-37k", "compiled, loss chunks 8")]
LAST = [(case, BUCKETS) for case in ("wmt-base-37k", "wmt-big-37k")]
# CPU: every eager variant, then every knob's code traced in two compilations (minutes each)
CPU_PLAN = [("tiny", name) for name in (*_EAGER, ALL, BUCKETS)]
BUDGET_S = 390.0  # the variants' time: with start-up, batches and one overrun the command stays under 8 minutes
AGREE_STEPS = 4  # first steps whose losses are compared
LR = 5e-4  # constant Adam rate: the first steps move the loss
TOLERANCE = {"bf16": 2e-2, "fp32": 1e-3}  # relative difference of a per-token loss
PROFILE_S = 10.0  # --profile's passes and tables, added to a variant's estimated time
SLOW_STEP = 10.0  # a step this many times the median is a recompilation, left out of tokens/s


def plan(settings: Settings) -> tuple[list[tuple[str, str]], float]:
    """(case, variant) pairs in the order they run (--steps, else the device's plan), and their time budget."""
    if settings.steps:
        steps, budget = list(settings.steps), BUDGET_S
    elif settings.device.type == "cuda" and not settings.quick:
        done = set(CUDA_PLAN + LAST)
        rest = [(case, name) for case in ("wmt-base-37k", "wmt-big-37k") for name in VARIANTS
                if (case, name) not in done]
        steps = CUDA_PLAN + rest + LAST
        budget = BUDGET_S
    else:
        steps, budget = CPU_PLAN, 900.0
    budget = settings.budget_s if settings.budget_s is not None else budget
    return [(c, n) for c, n in steps if not settings.cases or c in settings.cases], budget


def wmt_like_lengths(rng: np.random.Generator, pool: int, max_len: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths (pieces) of `pool` WMT14-like pairs: source log-normal (median 26,
    σ 0.6), target = source × a log-normal ratio (median 1.05, σ 0.2), both within 1 .. max_len."""
    src_len = np.clip(np.rint(rng.lognormal(np.log(26), 0.6, pool)), 1, max_len).astype(np.int64)
    ratio = rng.lognormal(np.log(1.05), 0.2, pool)
    return src_len, np.clip(np.rint(src_len * ratio), 1, max_len).astype(np.int64)


def wmt_like_batches(vocab: int, max_tokens: int, count: int, seed: int, pool: int, max_len: int = 250,
                     shape_buckets: int = 0) -> list[dict[str, Any]]:
    """`count` batches of random ids with WMT14-like lengths, bucketed as `ablate train` does."""
    rng = np.random.default_rng(seed)
    src_len, tgt_len = wmt_like_lengths(rng, pool, max_len)
    buckets = ShapeBuckets.fit(src_len, tgt_len, shape_buckets, max_tokens) if shape_buckets else None
    sampler = TokenBucketBatchSampler(src_len, tgt_len, max_tokens, shuffle=True, seed=seed,
                                      num_replicas=1, rank=0, buckets=buckets)
    ranks = np.arange(1, vocab - 3)
    zipf = ranks ** -1.1 / (ranks ** -1.1).sum()  # over ids 4 .. vocab - 1

    def pairs(index: list[int]) -> list[tuple[list[int], list[int]]]:
        lengths = np.stack([src_len[index], tgt_len[index]], axis=1).ravel()
        ids = (rng.choice(vocab - 4, size=int(lengths.sum()), p=zipf) + 4).tolist()
        ends = np.cumsum(lengths).tolist()
        flat = [ids[start:end] for start, end in zip([0, *ends[:-1]], ends)]
        return list(zip(flat[0::2], flat[1::2]))

    order = sampler.global_batches()
    chosen = order[:count]

    def aligned(index: list[int]) -> bool:  # its exact source width (ids + EOS) divisible by 8
        return (src_len[index].max() + 1) % 8 == 0

    if buckets is None and count > 1:  # one width divisible by 8 and one not, so that a compiled variant
        # meets both alignments and a guard on the source width shows as a second graph
        for want in (True, False):
            if not any(aligned(i) == want for i in chosen):
                swap = next((i for i in order[count:] if aligned(i) == want), None)
                if swap is not None:
                    chosen = [*chosen[:-1], swap] if want else [swap, *chosen[1:]]
    return [collate(pairs(index), buckets=buckets) for index in chosen]


DATA_KEYS = ("data.shape_buckets",)  # the data settings a variant may change (they choose its batches)


def configs(dims: dict[str, Any], vocab: int, overrides: dict[str, Any]) -> tuple[TransformerConfig, TrainConfig]:
    """A variant's model and train configs: `dims`, `vocab`, its model.* and train.* overrides."""
    sections: dict[str, dict[str, Any]] = {"model": {**dims, "vocab_size": vocab}, "train": {}}
    for key, value in overrides.items():
        section, _, name = key.partition(".")
        if key in DATA_KEYS:
            continue
        if section not in sections:
            raise ValueError(f"gpu_round variant override {key!r}: only model.*, train.* and "
                             f"{', '.join(DATA_KEYS)} are applied")
        sections[section][name] = value
    return TransformerConfig(**sections["model"]), TrainConfig(**sections["train"])


def shape_buckets(name: str) -> int:
    """The variant's data.shape_buckets (0: exact lengths), which decides its batches."""
    return int(VARIANTS[name].get("data.shape_buckets", 0))


def reference(name: str) -> str | None:
    """The eager default on the same batches, whose losses `name`'s are compared with (None: itself)."""
    eager = next((n for n, o in VARIANTS.items() if o == {k: v for k, v in VARIANTS[name].items() if k in DATA_KEYS}),
                 None)
    return None if eager == name else eager


def _seed(name: str, settings: Settings) -> int:
    return settings.seed + (1 if name == NOISE_FLOOR else 0)


class StepTimer:
    """Seconds of each step: CUDA events (read once, after the last step) or the host clock."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) / 1000 for a, b in zip(self.marks, self.marks[1:])]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def build(c: TransformerConfig, t: TrainConfig, state: dict[str, torch.Tensor] | None,
          settings: Settings) -> tuple[TranslationModule, Callable[[dict[str, Any]], torch.Tensor]]:
    """`common.bare_step` at the round's rate, compiled by Inductor on CUDA, traced without it on a CPU."""
    return bare_step(c, t, settings, LR, state, "inductor" if settings.device.type == "cuda" else "aot_eager")


def measure(name: str, case: Case, batches: dict[int, list[dict[str, Any]]], state: dict[str, torch.Tensor],
            settings: Settings) -> dict[str, Any]:
    """One variant: warm-up (and its first losses), then timed passes per batch size."""
    device = settings.device
    torch.compiler.reset()  # a fresh module's forward_loss must not count against the recompile limit
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    graphs = compiled_graphs()
    c, t = configs(case.dims, case.vocab, VARIANTS[name])
    _, step = build(c, t, state, settings)
    seeded(_seed(name, settings))  # dropout masks
    order = [b for size in case.tokens for b in batches[size]]
    start = time.perf_counter()
    losses = [step(b) for b in order]
    if t.compile:  # a second pass: CUDA graphs record a shape on its second call
        for b in order:
            step(b)
    sync(device)
    out: dict[str, Any] = {"warmup_s": time.perf_counter() - start,
                           "losses": [float(x) for x in torch.stack(losses[:AGREE_STEPS]).cpu()]}
    for size in case.tokens:
        timer = StepTimer(device)
        timer.mark()
        for _ in range(case.passes):
            for b in batches[size]:
                step(b)
                timer.mark()
        seconds = timer.seconds()
        flops = [train_flops(c, b) for b in batches[size]] * case.passes
        tokens = [b["n_tokens"] for b in batches[size]] * case.passes
        typical = float(np.median(seconds))
        kept = [i for i, s in enumerate(seconds) if s <= SLOW_STEP * typical]
        time_kept = sum(seconds[i] for i in kept)
        out[size] = {"tokens_per_s": sum(tokens[i] for i in kept) / time_kept,
                     "ms_per_step": 1000 * time_kept / len(kept),
                     "mfu": mfu(sum(flops[i] for i in kept) / time_kept, device),
                     "slow_steps": len(seconds) - len(kept)}
    out["graphs"] = compiled_graphs() - graphs if t.compile else 0
    out["recompiled_because"] = recompile_reasons() if t.compile else None
    if settings.profile:
        out["profile"] = {}
        for size in case.tokens:
            try:  # the profiler failing (CUPTI) costs the profile, not the measurement
                summary, table = profile_pass(step, batches[size], device)
            except Exception as error:
                out["profile_error"] = error_line(error)
                break
            out["profile"][size] = {**summary, "busy": summary["busy_ms_per_step"] / out[size]["ms_per_step"]}
            if settings.out is not None:
                path = settings.out / "profiles" / f"{case.name}-{slug(name)}-{size}.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, f"{case.name}, {name}, {size} tokens per batch and side, "
                                        f"one pass of {len(batches[size])} steps\n\n{table}\n")
    if device.type == "cuda":
        out["peak_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return out


# A kernel (CUDA) or aten op (CPU) belongs to the first group its name matches; Inductor's Triton
# kernels count as "fused (Triton)" unless they hold the loss or the optimizer.
TIME_GROUPS: dict[str, str] = {
    "attention": r"flash|fmha|attention|sdpa|scaled_dot_product|cudnn",  # before matmul: efficient's are CUTLASS
    "matmul": r"gemm|matmul|\bmm\b|aten::bmm|addmm|cutlass|xmma|nvjet|cublas",
    "loss": r"log_?softmax|logsumexp|nll_loss|cross_entropy",
    "optimizer": r"adam|multi_tensor|foreach",
    "fused (Triton)": r"^triton",
    "norm": r"layer_norm|rms_norm",
    "dropout": r"dropout|bernoulli|philox",
    "cast, copy, fill": r"copy|cast|convert|memcpy|memset|fill|zero",  # before elementwise: autocast's casts
    "elementwise": r"elementwise|reduce_kernel|softmax|aten::(add|sub|mul|div|neg|ne|eq|where|masked_fill|relu"
                   r"|gelu|silu|exp|sum|mean|clamp|addcdiv|addcmul|sqrt)_?$",
}
OTHER = "other"


def time_group(name: str) -> str:
    """The group of a kernel or op name (`TIME_GROUPS`, else "other")."""
    return next((group for group, pattern in TIME_GROUPS.items() if re.search(pattern, name, re.IGNORECASE)),
                OTHER)


def slug(name: str) -> str:
    """A variant's name as a file name: 'compiled, loss chunks 8' -> 'compiled-loss-chunks-8'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def profile_pass(step: Callable[[dict[str, Any]], torch.Tensor], batches: list[dict[str, Any]],
                 device: torch.device) -> tuple[dict[str, Any], str]:
    """One pass of `step` under torch.profiler: (busy time, group shares, top kernels; its table)."""
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for b in batches:
            step(b)
        sync(device)
    events = prof.key_averages()
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    us = {e.key: float(getattr(e, key)) for e in events if e.device_type == kind and getattr(e, key) > 0}
    total = sum(us.values()) or 1.0
    shares = dict.fromkeys([*TIME_GROUPS, OTHER], 0.0)
    for name, t in us.items():
        shares[time_group(name)] += t / total
    top = sorted(us.items(), key=lambda kv: -kv[1])[:12]
    summary = {"busy_ms_per_step": total / 1000 / len(batches), "shares": shares,
               "top": [{"name": name[:120], "group": time_group(name), "share": t / total} for name, t in top]}
    return summary, events.table(sort_by=key, row_limit=30, max_name_column_width=100)


def _rows(case: Case, name: str, result: dict[str, Any], reference: list[float] | None,
          tolerance: float) -> list[dict[str, Any]]:
    """Table rows of one variant: one per batch size, or one with why it did not run."""
    base = {"case": case.name, "variant": name}
    if "skipped" in result or "error" in result:
        return [{**base, "note": result.get("skipped") or f"error: {result['error']}"}]
    agree = None
    if reference:
        agree = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference))
    rows = []
    recompiled = result.get("recompiled_because")  # None: not compiled
    for size in case.tokens:
        r = result[size]
        notes = [f"{r['slow_steps']} slow step(s) left out"] if r["slow_steps"] else []
        notes += [f"recompiled: {recompiled[0]}"] if recompiled else []
        rows.append({**base, "tokens/batch": size, "tokens/s": r["tokens_per_s"], "ms/step": r["ms_per_step"],
                     "MFU": r["mfu"], "warm-up s": result["warmup_s"], "graphs": result["graphs"],
                     "peak GB": result.get("peak_gb"), "loss Δ": agree,
                     "agrees": None if agree is None or name == NOISE_FLOOR else agree <= tolerance,
                     "recompiled because": recompiled, "note": "; ".join(notes)})
    return rows


PROFILE_COLUMNS = ["case", "variant", "tokens/batch", "busy ms/step", "busy", *TIME_GROUPS, OTHER, "top kernel"]


def _profile_rows(case: Case, name: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of the profile table for one variant: one per batch size it profiled."""
    if "profile_error" in result:
        return [{"case": case.name, "variant": name, "top kernel": f"profile failed: {result['profile_error']}"}]
    rows = []
    for size, p in result.get("profile", {}).items():
        top = p["top"][0] if p["top"] else None
        rows.append({"case": case.name, "variant": name, "tokens/batch": size, "busy ms/step": p["busy_ms_per_step"],
                     "busy": p["busy"], **p["shares"],
                     "top kernel": f"{top['name'][:60]} ({top['share']:.0%})" if top else ""})
    return rows


def _estimate(case: str, name: str, done: dict[str, dict[str, dict[str, Any]]]) -> float:
    """Seconds a variant should take: its kind's slowest warm-up so far (× 1.5 across cases), + passes."""
    compiled = bool(VARIANTS[name].get("train.compile"))

    def warmups(results: dict[str, dict[str, Any]]) -> list[float]:
        return [r["warmup_s"] for n, r in results.items()
                if "warmup_s" in r and bool(VARIANTS[n].get("train.compile")) == compiled]

    same = warmups(done.get(case, {}))
    other = [w for c, results in done.items() if c != case for w in warmups(results)]
    guess = max(same) if same else 1.5 * max(other) if other else (90.0 if compiled else 10.0)
    return guess + 15.0


def case_batches(case: Case, settings: Settings, shape_buckets: int = 0) -> dict[int, list[dict[str, Any]]]:
    """The case's batches on the device, per batch size (`shape_buckets`: data.shape_buckets)."""
    return {size: [on_device(b, settings.device) for b in wmt_like_batches(
        case.vocab, size, case.batches, settings.seed, case.pool, case.max_len, shape_buckets)]
            for size in case.tokens}


def case_data(case: Case, settings: Settings) -> dict[str, Any]:
    """The case's exact-length batches (key 0), the initial weights every variant loads, its results."""
    c, _ = configs(case.dims, case.vocab, {})
    seeded(settings.seed)
    state = TranslationModule.from_configs(c, TrainConfig()).state_dict()
    return {"batches": {0: case_batches(case, settings)}, "state": state, "results": {}}


def variant_batches(case: Case, name: str, data: dict[str, Any], settings: Settings) -> dict[int, list[dict[str, Any]]]:
    """The batches variant `name` trains on (by its data.shape_buckets), made once per bucket count."""
    buckets = shape_buckets(name)
    if buckets not in data["batches"]:
        data["batches"][buckets] = case_batches(case, settings, buckets)
    return data["batches"][buckets]


def run_variant(case: Case, name: str, data: dict[str, Any], settings: Settings, deadline: float,
                done: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """One variant's measurement, or why it did not run (never raises); `done`: the results so far."""
    left, need = deadline - time.perf_counter(), _estimate(case.name, name, done) + (PROFILE_S if settings.profile else 0)
    isolated = name in ISOLATED
    need += ISOLATION_S if isolated else 0
    if left < need:
        return {"skipped": f"time budget: {left:.0f} s left, ~{need:.0f} s needed"}
    if isolated:
        return measure_apart(case, name, settings, left)
    try:
        return measure(name, case, variant_batches(case, name, data, settings), data["state"], settings)
    except Exception as error:  # a kernel this device lacks, out of memory: a row, not a crash
        why = error_line(error)
    free_memory(settings.device)  # the failed variant's module and tensors (its traceback is gone with `error`)
    return {"error": why}


def measure_apart(case: Case, name: str, settings: Settings, seconds: float) -> dict[str, Any]:
    """`measure` in a spawned process, rebuilt from the seed: its result, or how that process ended."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_measure_here, args=(send, case.name, name, settings, torch.get_num_threads()),
                              daemon=True)
    process.start()
    send.close()  # the child holds the sending end: its death closes the pipe
    result = None
    try:
        if receive.poll(seconds):
            result = receive.recv()
    except EOFError:  # the process ended without sending
        pass
    process.join(timeout=30 if result is not None else 5)
    if process.is_alive():
        process.kill()
        process.join()
        if result is None:
            return {"error": f"its own process was still running after {seconds:.0f} s (the budget left): killed"}
    if result is not None:
        return result
    code = process.exitcode or 0
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
    return {"error": f"its own process ended with {how} and no result (its stack, if any, is in this command's log)"}


def _measure_here(send: Any, case_name: str, name: str, settings: Settings, threads: int) -> None:
    """`measure_apart`'s process: `case_data`, then the variant's measurement (or error) sent back."""
    faulthandler.enable()  # a crash below Python prints the Python stack
    warnings.filterwarnings("ignore", category=UserWarning)  # as the command's own process
    torch.set_num_threads(threads)
    case = CASES[case_name]
    try:
        data = case_data(case, settings)
        result = measure(name, case, variant_batches(case, name, data, settings), data["state"], settings)
    except Exception as error:
        result = {"error": error_line(error)}
    send.send(result)
    send.close()


def run(settings: Settings) -> Section:
    section = Section("gpu_round", "GPU round: kernel variants of the training step (issue #40)",
                      ["case", "variant", "tokens/batch", "tokens/s", "ms/step", "MFU", "warm-up s", "graphs",
                       "peak GB", "loss Δ", "agrees", "note"],
                      formats={"MFU": "{:.1%}", "loss Δ": "{:.1e}"})
    if settings.profile:
        section.more.append(Section("gpu_round_profile", "Where the step's time goes (--profile: one pass under "
                                    "torch.profiler, shares of the busy time)", PROFILE_COLUMNS,
                                    formats={"busy": "{:.0%}", **{g: "{:.0%}" for g in [*TIME_GROUPS, OTHER]}}))
    steps, budget = plan(settings)
    deadline = time.perf_counter() + budget
    tolerance = TOLERANCE[settings.precision]
    data: dict[str, dict[str, Any]] = {}

    with stopwatch(section):
        for case_name, name in steps:
            case = CASES[case_name]
            if case_name not in data:
                data[case_name] = case_data(case, settings)
            results = data[case_name]["results"]
            results[name] = run_variant(case, name, data[case_name], settings, deadline,
                                        {c: d["results"] for c, d in data.items()})
            versus = reference(name)
            section.rows += _rows(case, name, results[name], results.get(versus or "", {}).get("losses"), tolerance)
            if settings.profile:
                section.more[0].rows += _profile_rows(case, name, results[name])
            section.data[case_name] = {"results": {k: {str(kk): vv for kk, vv in v.items()} for k, v in results.items()},
                                       "case": case.__dict__}
            print(json.dumps({"case": case_name, "variant": name, **section.data[case_name]["results"][name]},
                             default=str), flush=True)
            section.save(settings.out)
    for case_name, d in data.items():
        shapes = {f"{size} tokens" + (f", buckets {k}" if k else ""): [[*b["src"].shape, b["tgt_out"].size(1)] for b in bs]
                  for k, by_size in d["batches"].items() for size, bs in by_size.items()}
        section.data[case_name]["shapes"] = shapes
        section.notes.append(f"{case_name}: dims {CASES[case_name].dims}, vocabulary {CASES[case_name].vocab:,}; "
                             f"batches (sentences, source, target length) {shapes}; tolerance of the loss "
                             f"agreement {tolerance:.0e} relative ({settings.precision}).")
    section.notes += [
        "Batches: random ids (Zipf 1.1) with WMT14-like lengths (log-normal, median 26 pieces), bucketed by "
        "TokenBucketBatchSampler; no corpus is read. Step: forward_loss + backward + Adam on device-resident "
        f"batches, Adam at a constant {LR} so the first {AGREE_STEPS} steps' losses move.",
        "loss Δ: the largest relative difference of the first steps' per-token losses from the eager default's "
        "(same weights, batches and seed); compiled variants draw other dropout masks (Inductor's RNG), whose "
        "size the 'eager, other dropout seed' row shows. On CPU compiled variants run dynamo + AOTAutograd "
        "without Inductor (aot_eager), and attention efficient/cudnn fall to the CPU's kernels: a smoke "
        "check of the code paths, not a speed.",
        "Not measured: bf16 weight casts once per step (autocast already casts each weight once per forward; "
        "merging the casts needs parameters in one flat buffer), packed variable-length sequences (nested "
        "jagged tensors), decoding (the generation benchmark).",
    ]
    if settings.device.type == "cuda" and steps:
        first = CASES[steps[0][0]]
        best = max((r["MFU"] for r in section.rows if r.get("MFU") and r["case"] == first.name
                    and r.get("tokens/batch") == max(first.tokens)), default=None)
        section.target(f"{first.name}: best variant's MFU at {max(first.tokens)} tokens", best,
                       "≥ 40%", None if best is None else best >= 0.40)
    section.save(settings.out)
    return section
