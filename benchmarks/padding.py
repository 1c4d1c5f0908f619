"""Benchmark 3: padding waste of our token bucketing against random order, a plain (target, source) sort
and static shape buckets at one budget, on Ding (and Multi30k when its files are found)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.common import Section, Settings, data_module, stopwatch
from lightning_modules.data.batching import ShapeBuckets, TokenBucketBatchSampler, batch_shapes, cut_points, padding_share

TARGET_PADDING = 0.05
RANDOM_SEEDS = (1, 2, 3)
SHAPE_BUCKETS = (8, 24)  # data.shape_buckets candidates


def _split(order: np.ndarray, widths: np.ndarray, max_tokens: int) -> list[list[int]]:
    """Greedy cuts of `order` (examples in that order) under the token budget."""
    ends = cut_points(widths[order], max_tokens)
    return [chunk.tolist() for chunk in np.split(order, ends[:-1])] if ends else []


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem, f"{stem}.gz"):
        if (directory / name).is_file():
            return directory / name
    return None


def multi30k_files(directory: Path | None) -> dict[str, str] | None:
    """`--data files` settings for a Multi30k directory (train + val, else test_2016_flickr)."""
    if directory is None or not directory.is_dir():
        return None
    train_src, train_tgt = _find(directory, "train.en"), _find(directory, "train.de")
    for held_out in ("val", "test_2016_flickr"):
        valid_src, valid_tgt = _find(directory, f"{held_out}.en"), _find(directory, f"{held_out}.de")
        if valid_src and valid_tgt:
            break
    if not (train_src and train_tgt and valid_src and valid_tgt):
        return None
    return {"train_src": str(train_src), "train_tgt": str(train_tgt),
            "valid_src": str(valid_src), "valid_tgt": str(valid_tgt)}


def measure(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, seed: int
            ) -> dict[str, dict[str, float]]:
    """Padding share, batch count and mean sentences per batch of each batching."""
    src, tgt = src_lengths + 1, tgt_lengths + 1  # + EOS / BOS, as collated
    widths = np.maximum(src, tgt)

    def describe(batches: list[list[int]]) -> dict[str, float]:
        return {"padding": padding_share(batches, src_lengths, tgt_lengths),
                "batches": len(batches), "sentences_per_batch": len(src) / max(len(batches), 1)}

    ours = TokenBucketBatchSampler(src_lengths, tgt_lengths, max_tokens, shuffle=True, seed=seed,
                                   num_replicas=1, rank=0).global_batches()
    randoms = [describe(_split(np.random.default_rng(s).permutation(len(src)), widths, max_tokens))
               for s in RANDOM_SEEDS]
    random = {key: float(np.mean([r[key] for r in randoms])) for key in randoms[0]}
    plain = _split(np.lexsort((src, tgt)), widths, max_tokens)
    result = {"ours": describe(ours), "random": random, "sorted (tgt, src)": describe(plain)}
    for count in SHAPE_BUCKETS:
        buckets = ShapeBuckets.fit(src_lengths, tgt_lengths, count, max_tokens)
        batches = TokenBucketBatchSampler(src_lengths, tgt_lengths, max_tokens, shuffle=True, seed=seed,
                                          num_replicas=1, rank=0, buckets=buckets).global_batches()
        result[f"buckets {count}"] = {
            "padding": padding_share(batches, src_lengths, tgt_lengths, buckets=buckets),
            "batches": len(batches), "sentences_per_batch": len(src) / max(len(batches), 1),
            "shapes": len(set(batch_shapes(batches, src_lengths, tgt_lengths, buckets=buckets)))}
    return result


def run(settings: Settings) -> Section:
    section = Section("padding", "3. Padding waste: token bucketing vs random batching",
                      ["corpus", "max_tokens", "sentences", "ours", "random", "sorted (tgt, src)",
                       *(f"buckets {k}" for k in SHAPE_BUCKETS), *(f"shapes {k}" for k in SHAPE_BUCKETS),
                       "random/ours", "ours batches", "random batches"],
                      formats={k: "{:.1%}" for k in ("ours", "random", "sorted (tgt, src)",
                                                     *(f"buckets {k}" for k in SHAPE_BUCKETS))})
    vocab = 2000 if settings.quick else 8000
    budgets = [1500] if settings.quick else [1500, 4000, 25000]
    with stopwatch(section):
        corpora: list[tuple[str, dict]] = [("Ding", {})]
        files = multi30k_files(settings.multi30k_dir)
        if files:
            corpora.append(("Multi30k", files))
        else:
            section.notes.append(f"Multi30k skipped: no train.{{en,de}}[.gz] and val or "
                                 f"test_2016_flickr files in {settings.multi30k_dir}.")
        for name, files in corpora:
            dm = data_module(settings, vocab, corpus="files" if files else "ding", **files)
            src, tgt = dm.train_set.src_lengths, dm.train_set.tgt_lengths
            for max_tokens in budgets:
                result = measure(src, tgt, max_tokens, settings.seed)
                ours, random = result["ours"]["padding"], result["random"]["padding"]
                section.rows.append({
                    "corpus": name, "max_tokens": max_tokens, "sentences": len(src),
                    "ours": ours, "random": random,
                    "sorted (tgt, src)": result["sorted (tgt, src)"]["padding"],
                    **{f"buckets {k}": result[f"buckets {k}"]["padding"] for k in SHAPE_BUCKETS},
                    **{f"shapes {k}": result[f"buckets {k}"]["shapes"] for k in SHAPE_BUCKETS},
                    "random/ours": random / ours if ours else None,
                    "ours batches": result["ours"]["batches"],
                    "random batches": round(result["random"]["batches"])})
                section.target(f"padding {name} @ {max_tokens}", ours, f"≤ {TARGET_PADDING:.0%}",
                               ours <= TARGET_PADDING)
                section.data[f"{name}@{max_tokens}"] = result
    section.notes += [
        f"Share of padded slots in src + tgt_out over one epoch of training batches (BPE "
        f"{vocab:,} trained on each corpus's training text); random = mean of "
        f"{len(RANDOM_SEEDS)} shuffles cut greedily under the same budget.",
        "Fewer batches at the same budget = more real tokens per step.",
        "buckets K = data.shape_buckets K (static shapes for CUDA graphs; shapes K = distinct "
        "(rows, source, target) batch shapes in the epoch); exact lengths pad least.",
    ]
    return section
