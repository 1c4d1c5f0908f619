"""Benchmark (opt-in): what a shape not met before costs each attention kernel (issue #40).

    python -m benchmarks --device cuda --only attention_shapes --out DIR   # one H100/H200, about 2 minutes
    python -m benchmarks --only attention_shapes --quick                   # CPU smoke check, tiny dims

Why: nearly every batch of a run's first epoch has a new shape (`shape_counts`), and cuDNN's
attention builds a plan per problem: host time that `gpu_round`, repeating six batches, never shows.
Method (the table's notes give it in full): per kernel, each new batch stepped twice in a row, the
difference being a new shape's cost (the math kernel steps every batch first, so the allocator's
growth is nobody's first visit), added for a third of an epoch's attention problems to `RUN_STEPS`.

Decision, stated before any GPU figure: `model.attention_backend`'s default stays "auto" unless
another kernel's `gpu` preset estimate at 25,000 tokens is at least 10% below auto's; then that
kernel becomes the default. The CPU has neither efficient's nor cuDNN's kernel, so its kernel
does not change. The estimate uses eager steps while a `gpu` preset run is compiled (35 ms a step
at 25,000 tokens on the H200 against eager's 69): per-shape costs that remain when compiled are a
larger share of its time than the estimate says."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from benchmarks.common import (BASE, TINY, Section, Settings, error_line, free_memory, median, on_device, seeded,
                               stopwatch, sync)
from benchmarks.gpu_round import build, configs, wmt_like_batches, wmt_like_lengths
from lightning_modules.config import ATTENTION_BACKENDS, TrainConfig
from lightning_modules.data.batching import ShapeBuckets, TokenBucketBatchSampler, batch_shapes, padding_share
from lightning_modules.translation import TranslationModule

# "auto" (the default) first, every other compared with it; then what auto may be on a GPU
KERNELS = ("auto", "efficient", "cudnn", "flash", "math")
assert set(KERNELS) == set(ATTENTION_BACKENDS)
SHAPE_POOL = 1_000_000  # the gpu preset's data.train_pairs
RUN_STEPS = 10_000  # the gpu preset's base run (scale.steps 0.1)
GAIN = 0.10  # a kernel replaces "auto" as the default when its run estimate is this much lower
ATTENTION = ("encoder self", "decoder self", "cross")  # the attention calls of a step, by their problem
BUCKETS = 8  # data.shape_buckets for the counts' static-shape columns (the GPU round's "buckets 8")


def sizes(settings: Settings) -> dict[str, Any]:
    if settings.quick:
        return {"dims": TINY, "vocab": 500, "tokens": (600,), "pool": 3_000, "max_len": 60, "warm": 1, "new": 2,
                "decode_rows": 4, "decode_source": 9, "decode_steps": 6, "run_pool": 3_000}
    return {"dims": BASE, "vocab": 37_000, "tokens": (25_000, 4_000), "pool": 120_000, "max_len": 250, "warm": 4,
            "new": 6, "decode_rows": 128, "decode_source": 30, "decode_steps": 32, "run_pool": SHAPE_POOL}


def shape_counts(tokens: int, pool: int, seed: int, max_len: int = 250) -> dict[str, Any]:
    """One epoch of `pool` pairs at `tokens`: batches, distinct shapes and problems, padding, bucketed."""
    src, tgt = wmt_like_lengths(np.random.default_rng(seed), pool, max_len)
    sampler = TokenBucketBatchSampler(src, tgt, tokens, shuffle=True, seed=seed, num_replicas=1, rank=0)
    batches = sampler.global_batches()
    shapes = set(batch_shapes(batches, src, tgt))
    buckets = ShapeBuckets.fit(src, tgt, BUCKETS, tokens)
    static = TokenBucketBatchSampler(src, tgt, tokens, shuffle=True, seed=seed, num_replicas=1, rank=0,
                                     buckets=buckets).global_batches()
    return {"batches": len(batches), "shapes": len(shapes),
            "encoder self": len({(b, s) for b, s, _ in shapes}),
            "decoder self": len({(b, t) for b, _, t in shapes}), "cross": len(shapes),
            "padding": padding_share(batches, src, tgt),
            f"shapes, buckets {BUCKETS}": len(set(batch_shapes(static, src, tgt, buckets=buckets))),
            f"padding, buckets {BUCKETS}": padding_share(static, src, tgt, buckets=buckets)}


def _shape(batch: dict[str, Any]) -> tuple[int, int, int]:
    return batch["src"].size(0), batch["src"].size(1), batch["tgt_in"].size(1)


def distinct_batches(s: dict[str, Any], tokens: int, count: int, seed: int) -> list[dict[str, Any]]:
    """`count` batches of one epoch at `tokens`, no two of one shape."""
    seen, out = set(), []
    for batch in wmt_like_batches(s["vocab"], tokens, 3 * count, seed, s["pool"], s["max_len"]):
        if _shape(batch) not in seen:
            seen.add(_shape(batch))
            out.append(batch)
    if len(out) < count:
        raise RuntimeError(f"only {len(out)} distinct batch shapes at {tokens} tokens, {count} wanted")
    return out[:count]


def timed(fn, device: torch.device) -> float:
    """Seconds of `fn()`, the device synchronised before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


@torch.no_grad()
def decode(model, rows: int, source: int, steps: int, fixed: bool, settings: Settings) -> list[float]:
    """Seconds of each of `steps` incremental decoder steps for `rows` random sources of `source` pieces."""
    device, vocab = settings.device, model.config.vocab_size
    src = torch.randint(4, vocab, (rows, source), device=device)
    token = torch.randint(4, vocab, (rows,), device=device)
    with settings.autocast():
        memory, mask = model.encode(src)
        caches = model.fixed_size_cache(memory, steps) if fixed else [{} for _ in model.decoder]
        position = (lambda i: torch.tensor(i, device=device)) if fixed else (lambda i: i)
        return [timed(lambda: model.decode_step(token, memory, mask, caches, position(i)), device)
                for i in range(steps)]


def _train_rows(kernel: str, k: int, s: dict[str, Any], state: dict[str, torch.Tensor],
                batches: dict[int, list[dict[str, Any]]], first_visits: dict[int, float], settings: Settings
                ) -> tuple[list[dict[str, Any]], Any]:
    """`kernel`'s training rows (its k-th share of the new batches) and its module."""
    device, rows = settings.device, []
    c, t = configs(s["dims"], s["vocab"], {"model.attention_backend": kernel})
    module, step = build(c, t, state, settings)
    for tokens in s["tokens"]:
        shared, rest = batches[tokens][:s["warm"]], batches[tokens][s["warm"]:]
        for b in shared:  # kernel modules load; these shapes are cached from here on
            step(b)
        steady = [timed(lambda: step(b), device) for b in shared]  # every kernel on the same batches
        first, again = [], []
        for b in rest[k * s["new"]:(k + 1) * s["new"]]:
            first.append(timed(lambda: step(b), device))
            again.append(timed(lambda: step(b), device))
        new_ms = 1000 * median([f - a for f, a in zip(first, again)])
        rows.append({"kernel": kernel, "work": f"train step, {tokens:,} tokens", "tokens": tokens,
                     "step ms": 1000 * float(np.mean(steady)), "first visit ms": 1000 * median(first),
                     "again ms": 1000 * median(again), "new shape costs ms": new_ms,
                     "gpu run estimate s": RUN_STEPS * float(np.mean(steady))
                     + first_visits[tokens] * max(new_ms, 0.0) / 1000})
        print(f"  {kernel}, train {tokens}: step {1000 * np.mean(steady):.1f} ms; a new shape {new_ms:.1f} ms",
              flush=True)
    return rows, module


def _decode_rows(kernel: str, k: int, s: dict[str, Any], model, settings: Settings) -> list[dict[str, Any]]:
    """`kernel`'s decoding rows, on numbers of rows no kernel before it decoded."""
    rows = []
    decode(model, s["decode_rows"] + len(KERNELS) + k, s["decode_source"], 2, False, settings)  # kernels load
    for fixed in (False, True):
        n = s["decode_rows"] + k
        passes = [decode(model, n, s["decode_source"], s["decode_steps"], fixed, settings) for _ in range(2)]
        name = "fixed-size caches" if fixed else "growing caches"
        rows.append({"kernel": kernel, "work": f"decode step, {name}, {n} rows",
                     "first visit ms": 1000 * np.mean(passes[0]), "again ms": 1000 * np.mean(passes[1]),
                     "new shape costs ms": 1000 * (np.mean(passes[0]) - np.mean(passes[1]))})
        print(f"  {kernel}, decode ({name}): first pass {sum(passes[0]):.2f} s, again {sum(passes[1]):.2f} s",
              flush=True)
    return rows


def run(settings: Settings) -> Section:
    s = sizes(settings)
    device = settings.device
    section = Section("attention_shapes", "What a shape not met before costs each attention kernel (issue #40)",
                      ["kernel", "work", "step ms", "first visit ms", "again ms", "new shape costs ms",
                       "gpu run estimate s", "vs auto"], formats={"vs auto": "{:.2f}"})
    counts = Section("attention_shapes_counts", "Shapes a `gpu` preset run meets: one epoch of its 1M pairs "
                     "(later epochs add none; --quick: 3,000)",
                     ["tokens/batch", "batches", "shapes", "encoder self", "decoder self", "cross", "padding",
                      f"shapes, buckets {BUCKETS}", f"padding, buckets {BUCKETS}"],
                     formats={"padding": "{:.1%}", f"padding, buckets {BUCKETS}": "{:.1%}"})
    section.more.append(counts)
    section.notes += [
        f"Training: per kernel, {s['warm']} batches every kernel shares, stepped twice (step ms: the mean of the "
        f"second pass), then {s['new']} batches of shapes no earlier kernel met, each stepped twice in a row (first "
        "visit, again: medians; a new shape costs: the median of the pairs' differences). Eager, Adam; dims "
        f"{s['dims']}, vocabulary {s['vocab']:,}.",
        f"gpu run estimate: {RUN_STEPS:,} steps at 'step ms' + the new-shape cost for each third of the run's distinct "
        "attention problems (the second table: encoder self + decoder self + cross, over 3; a sampled batch brings "
        "one of each).",
        f"Decoding: {s['decode_steps']} incremental steps of random sources of {s['decode_source']} pieces, twice; "
        "mean ms per step. Growing caches meet a new key length every step; fixed-size caches one per batch.",
        "On a CPU, efficient and cudnn fall to the CPU's kernels, and nothing is cached per shape: a smoke check.",
    ]

    with stopwatch(section):
        for tokens in s["tokens"]:
            counts.rows.append({"tokens/batch": tokens, **shape_counts(tokens, s["run_pool"], settings.seed)})
        # a run's first visits in sampled batches' worth (each brings a new problem per call)
        first_visits = {row["tokens/batch"]: sum(row[k] for k in ATTENTION) / len(ATTENTION) for row in counts.rows}
        c, _ = configs(s["dims"], s["vocab"], {})
        seeded(settings.seed)
        state = TranslationModule.from_configs(c, TrainConfig()).state_dict()
        batches = {}
        for tokens in s["tokens"]:
            found = distinct_batches(s, tokens, s["warm"] + s["new"] * len(KERNELS), settings.seed)
            batches[tokens] = [on_device(b, device) for b in found]
        # the allocator meets every batch once before any kernel is timed (math caches nothing per shape)
        _, step = build(*configs(s["dims"], s["vocab"], {"model.attention_backend": "math"}), state, settings)
        for b in (b for tokens in s["tokens"] for b in batches[tokens]):
            step(b)
        del step
        auto: dict[int, float] = {}
        for k, kernel in enumerate(KERNELS):
            try:
                rows, module = _train_rows(kernel, k, s, state, batches, first_visits, settings)
                module.eval()
                rows += _decode_rows(kernel, k, s, module.model, settings)
                del module
            except Exception as error:  # a kernel this device lacks, out of memory: a row, not a crash
                rows = [{"kernel": kernel, "work": f"failed: {error_line(error)}"}]
            free_memory(device)
            for row in (row for row in rows if "tokens" in row):
                if kernel == "auto":
                    auto[row["tokens"]] = row["gpu run estimate s"]
                row["vs auto"] = row["gpu run estimate s"] / auto[row["tokens"]] if row["tokens"] in auto else None
            section.rows += rows
            section.save(settings.out)  # after each kernel: a step cut short keeps what was measured
        preset = [row for row in section.rows if row.get("tokens") == s["tokens"][0] and row["vs auto"] is not None]
        if preset:  # the preset's budget, against auto
            best = min(preset, key=lambda row: row["vs auto"])
            section.target(f"a gpu run's estimate, best kernel ({best['kernel']}) below auto's", 1 - best["vs auto"],
                           f"≥ {GAIN:.0%} to change the default",
                           None if settings.quick or device.type != "cuda" else 1 - best["vs auto"] >= GAIN)
    section.data = {"sizes": {key: value for key, value in s.items() if key != "dims"}, "dims": s["dims"]}
    section.save(settings.out)
    return section
