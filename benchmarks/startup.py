"""Benchmark 10 (opt-in): where `ablate train`'s start-up goes, for a table's first run and its next:
`ablate train` twice on WMT-length synthetic text (`corpus`) with one empty `data.cache_dir` (the
first trains the BPE and encodes, the next reads both from the cache), base dims, 2 steps; the
figures are each run's `startup_s`, its parts and data stages, and the imports by package.
Target: start-up ≤ 15 s."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, Section, Settings, stopwatch

BASE = ["n_layers=6", "d_model=512", "d_ff=2048", "n_heads=8"]
TINY = ["n_layers=1", "d_model=32", "d_ff=64", "n_heads=4"]
TARGET_S = 15.0
# short: an untrained model's decoding of a longer dev set outlasts the start-up measured
DEV_PAIRS, DECODE_OFFSET = 20, 5
IMPORTS = "import ablate.cli; from lightning_modules.run.train import train"  # what `ablate train` imports first
TOP_PACKAGES = 8  # packages named in the split; the rest are one row
DING = Path("/usr/share/trans/de-en")
CHUNK = 100_000  # sentences generated at a time
SYLLABLES = [c + v for c in ("b", "ch", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "sch",
                             "st", "t", "v", "w", "z", "br", "tr", "gr")
             for v in ("a", "e", "i", "o", "u", "ä", "ö", "ü", "au", "ei", "ie", "en", "er", "an")]


def vocabularies(rng: np.random.Generator, extra: int = 400_000) -> dict[str, list[str]]:
    """English and German words, most frequent first: Ding's (if installed), then `extra` made-up ones."""
    found: dict[str, Counter[str]] = {"en": Counter(), "de": Counter()}
    if DING.is_file():
        word = re.compile(r"[^\W\d_]{2,}")
        for line in DING.read_text(encoding="utf-8", errors="replace").splitlines():
            if " :: " in line:
                de, en = line.split(" :: ", 1)
                found["de"].update(word.findall(de))
                found["en"].update(word.findall(en))
    out = {}
    for lang, counts in found.items():
        words = sorted(counts, key=counts.get, reverse=True)
        syllables = rng.integers(0, len(SYLLABLES), size=(extra, 5))
        sizes = rng.integers(1, 6, size=extra)
        made = {"".join(SYLLABLES[s] for s in row[:n]) for row, n in zip(syllables, sizes)}
        out[lang] = words + sorted(made - set(counts))
    return out


class Sampler:
    """Sentences of one language as bytes: Zipf-like word draws (p ∝ 1/(rank + 2.7))."""

    def __init__(self, words: list[str]) -> None:
        self.spaced = np.array([(w + " ").encode() for w in words], dtype=object)
        self.ended = np.array([(w + ".\n").encode() for w in words], dtype=object)
        weights = 1.0 / (np.arange(len(words)) + 2.7)
        self.cdf = np.cumsum(weights / weights.sum())

    def text(self, rng: np.random.Generator, lengths: np.ndarray) -> bytes:
        """One line per entry of `lengths` (words), each ending in '.'."""
        ids = np.minimum(np.searchsorted(self.cdf, rng.random(int(lengths.sum()))), len(self.cdf) - 1)
        tokens = self.spaced[ids]
        ends = np.cumsum(lengths) - 1
        tokens[ends] = self.ended[ids[ends]]
        return b"".join(tokens.tolist())


def lengths(rng: np.random.Generator, n: int, mu: float, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(English, German) words per sentence: lognormal English, German within ~15% of it."""
    en = np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, 400).astype(np.int64)
    de = np.clip(np.rint(en * rng.lognormal(0.0, 0.15, n)), 1, 450).astype(np.int64)
    return en, de


def write_pairs(folder: Path, stem: str, n: int, mu: float, sigma: float,
                samplers: dict[str, Sampler], rng: np.random.Generator) -> dict[str, Path]:
    """`folder/STEM.en` and `.de`: `n` aligned synthetic sentences, written in chunks."""
    paths = {lang: folder / f"{stem}.{lang}" for lang in ("en", "de")}
    with open(paths["en"], "wb") as en_out, open(paths["de"], "wb") as de_out:
        for start in range(0, n, CHUNK):
            en, de = lengths(rng, min(CHUNK, n - start), mu, sigma)
            en_out.write(samplers["en"].text(rng, en))
            de_out.write(samplers["de"].text(rng, de))
    return paths


def corpus(folder: Path, pairs: int, dev: int, seed: int = 0) -> dict[str, str]:
    """`--data files` settings: `pairs` training and `dev` dev pairs of WMT-length synthetic text."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = vocabularies(rng, extra=100_000)
    samplers = {lang: Sampler(words[lang]) for lang in ("en", "de")}
    train = write_pairs(folder, "train", pairs, 3.0, 0.65, samplers, rng)
    valid = write_pairs(folder, "valid", dev, 3.0, 0.65, samplers, rng)
    return {"train-src": str(train["en"]), "train-tgt": str(train["de"]),
            "valid-src": str(valid["en"]), "valid-tgt": str(valid["de"])}


def train(files: dict[str, str], work: Path, name: str, seed: int, settings: Settings) -> dict[str, Any]:
    """One `ablate train` on `files` with the shared cache `work/cache`: its results.json."""
    out = work / name
    hardware = ["--accelerator", "gpu", "--devices", "1"] if settings.device.type == "cuda" else \
        ["--accelerator", "cpu"]
    cmd = [sys.executable, "-m", "ablate", "train", "--data", "files",
           *[arg for key, path in files.items() for arg in (f"--{key}", path)],
           "--out", str(out), "--seed", str(seed), "--max-steps", "2", "--no-wandb", *hardware,
           *(TINY if settings.quick else BASE), f"data.vocab_size={1000 if settings.quick else 37000}",
           "data.max_tokens=4000", f"data.cache_dir={work / 'cache'}", "train.compile=false",
           "train.val_check_interval=2", "eval.beam_size=1", f"eval.max_len_offset={DECODE_OFFSET}",
           "eval.decode_test=false", "train.progress_bar=false"]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"ablate train ({name}) exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {**json.loads((out / "results.json").read_text()), "process_s": time.perf_counter() - start}


def import_times(lines: list[str]) -> dict[str, float]:
    """Seconds per top-level package, largest first, from `python -X importtime` lines."""
    totals: dict[str, float] = defaultdict(float)
    for line in lines:
        found = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)\s*$", line)
        if found:
            totals[found.group(2).split(".")[0]] += int(found.group(1)) / 1e6
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def imports_by_package() -> dict[str, float]:
    """`import_times` of one process importing `IMPORTS` (bytecode already cached by the runs)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", IMPORTS], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"importing {IMPORTS!r} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return import_times(done.stderr.splitlines())


def rows_of(run: str, result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per start-up part, its data stages under `data`, then the whole start-up."""
    stages = {s["stage"]: s["wall_s"] for s in result["data"]["stages"]}
    rows = []
    for part in result["startup"]:
        detail = ", ".join(f"{stage} {s:.2f}" for stage, s in stages.items()) if part["part"] == "data" else ""
        rows.append({"run": run, "part": part["part"], "s": part["s"], "detail": detail})
    prepared = result["data"].get("prepared") or {}
    taken = ["BPE" if prepared.get("bpe") == "cache" else "", *prepared.get("encoded_from_cache", [])]
    rows.append({"run": run, "part": "start-up", "s": result["startup_s"],
                 "detail": "from the cache: " + (", ".join(t for t in taken if t) or "nothing")})
    return rows


def run(settings: Settings) -> Section:
    section = Section("startup", "10. Where `ablate train`'s start-up goes: a table's first run and its next "
                      "(the preparation cache)", ["run", "part", "s", "detail"])
    pairs, dev = (4_000, 100) if settings.quick else (48_000, DEV_PAIRS)
    work = Path(tempfile.mkdtemp(prefix="ablate-startup-"))
    try:
        with stopwatch(section):
            files = corpus(work / "text", pairs, dev)
            for run_name, seed in (("first", 1), ("next", 2)):
                result = train(files, work, run_name, seed, settings)
                section.rows += rows_of(run_name, result)
                section.data[run_name] = {key: result.get(key) for key in ("startup_s", "startup", "first_step_s",
                                                                        "process_s", "device", "params")}
                section.data[run_name]["data"] = {key: result["data"].get(key) for key in
                                                  ("stages", "prepared", "train_pairs", "vocab_size")}
                parts = ", ".join(f"{p['part']} {p['s']:.1f}" for p in result["startup"])
                print(f"  {run_name}: start-up {result['startup_s']:.1f} s ({parts}); the whole process "
                      f"{result['process_s']:.1f} s", flush=True)
            packages = imports_by_package()
            named = list(packages.items())[:TOP_PACKAGES]
            rest = sum(packages.values()) - sum(s for _, s in named)
            section.rows += [{"run": "imports by package", "part": name, "s": s, "detail": ""} for name, s in named]
            section.rows += [{"run": "imports by package", "part": f"{len(packages) - len(named)} others", "s": rest,
                              "detail": ""},
                             {"run": "imports by package", "part": "all", "s": sum(packages.values()),
                              "detail": IMPORTS}]
            section.data["imports_by_package"] = packages
            print("  imports: " + ", ".join(f"{name} {s:.1f}" for name, s in named), flush=True)
        following = section.data["next"]["startup_s"]
        section.target("start-up of a table's next run (s)", following, f"≤ {TARGET_S:g} s",
                       None if settings.quick else following <= TARGET_S)
        section.notes += [
            f"{pairs:,} training pairs of synthetic WMT-length text, {dev} dev; "
            + ("tiny dims, BPE 1,000 (--quick)" if settings.quick else "base dims, BPE 37,000"),
            "imports: Python, the imports, the command line; checks: hardware, memory, W&B, the run directory; "
            "data: its stages in detail (wall s); trainer: the Trainer, loggers and callbacks; fit: Lightning's "
            "set-up to the first batch (the device, the optimizer)",
            "first: an empty data.cache_dir; next: the same cache, another run directory and seed",
            "process_s in the JSON: each `ablate train` process's whole wall time (its 2 steps, dev decoding "
            "and exit included)"]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return section
