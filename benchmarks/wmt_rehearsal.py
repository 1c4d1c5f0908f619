"""Benchmark 9 (opt-in): a WMT14-scale rehearsal of the `gpu` preset's data path, on a CPU.

Method: synthetic archives with WMT14's real layout are written once into a cache folder (the three
statmt.org `.tgz` files under their own names, their EN-DE members at WMT14's pair counts beside the
archive's other language pairs, which extraction must pass over; newstest2013/2014 as the mirror's
plain files), served by `http.server` on 127.0.0.1 from a thread, and `ablate train --preset gpu
--data wmt14 --base-url http://127.0.0.1:PORT/` runs as a subprocess through download, extraction,
reading, the 1M-pair subset, BPE training, encoding and batching to its first steps, with the
preset's data settings untouched (train_pairs, vocab_size, spm_input_sentence_size, max_tokens,
max_train_len) and only the model shrunk (1 layer, d_model 32) and cut to a few steps. The run
records each data stage's wall seconds, CPU seconds (user + system, all threads) and peak RSS itself
(`results.json` data.stages); this module adds the whole process's CPU seconds (its rusage) and
peak RSS (sampled from /proc every 0.1 s).

Text: per archive a lognormal sentence length (mean ~25 English words, a tail past 200 words; Common
Crawl's heavier), German about as long; words drawn Zipf-like from the Ding dictionary's words and
random syllable words (~450K types a side), so that a BPE of 8,000 or 37,000 pieces has work to do.
"""

from __future__ import annotations

import functools
import http.server
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import REPO, Section, Settings, stopwatch
from lightning_modules.data.corpora import WMT14_TRAIN_ARCHIVES

DING = Path("/usr/share/trans/de-en")
WMT14_PAIRS = 4_520_620  # Europarl v7 + Common Crawl + News Commentary v9, EN-DE
# Per archive: EN-DE pairs, the other pairs' members (language, pairs) in archive order around the
# EN-DE ones, and the English length distribution (lognormal mu, sigma of words per sentence).
ARCHIVES: dict[str, dict[str, Any]] = {
    "europarl": {"pairs": 1_920_209, "before": [("cs", 646_605)],
                 "after": [("es", 1_965_734), ("fr", 2_007_723)], "mu": 3.0, "sigma": 0.65},
    "commoncrawl": {"pairs": 2_399_123, "before": [("cs", 161_838)],
                    "after": [("es", 1_845_286), ("fr", 3_244_152), ("ru", 878_386)],
                    "mu": 2.75, "sigma": 0.85},
    "nc-v9": {"pairs": 201_288, "before": [("cs", 146_549)],
                        "after": [("fr", 183_251), ("ru", 165_602)], "mu": 3.05, "sigma": 0.6},
}
NEWSTEST = {"newstest2013": 3000, "newstest2014": 3003}
MODEL = ["n_layers=1", "d_model=32", "d_ff=64", "n_heads=4"]
CHUNK = 100_000  # sentences generated at a time
SYLLABLES = [c + v for c in ("b", "ch", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "sch",
                             "st", "t", "v", "w", "z", "br", "tr", "gr")
             for v in ("a", "e", "i", "o", "u", "ä", "ö", "ü", "au", "ei", "ie", "en", "er", "an")]


# ----------------------------------------------------------------------------------- text

def vocabularies(rng: np.random.Generator, extra: int = 400_000) -> dict[str, list[str]]:
    """English and German word lists, most frequent first: the Ding dictionary's words (by their
    count there; none if it is not installed), then `extra` random syllable words each."""
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


class _Repeat(io.RawIOBase):
    """A file's bytes over and over (the archives' other language pairs: passed over, never read)."""

    def __init__(self, path: Path) -> None:
        self.data = path.read_bytes()[: 64 << 20]
        self.position = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        view, filled = memoryview(buffer), 0
        while filled < len(view):  # full reads: tarfile takes a short one for the end of data
            start = self.position % len(self.data)
            size = min(len(view) - filled, len(self.data) - start)
            view[filled:filled + size] = self.data[start:start + size]
            filled += size
            self.position += size
        return filled


def _add(tar: tarfile.TarFile, name: str, size: int, source) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 1_400_000_000, 0o644
    tar.addfile(info, source)


def write_archive(path: Path, prefix: str, spec: dict[str, Any], scale: float, work: Path,
                  samplers: dict[str, Sampler], rng: np.random.Generator) -> int:
    """One `.tgz` with the EN-DE members `PREFIX.en`/`.de` and the archive's other pairs' members
    (`...cs-en.cs`, `...cs-en.en`, ...: as many bytes per pair, filler) in order; its EN-DE pairs."""
    pairs = max(1, round(spec["pairs"] * scale))
    texts = write_pairs(work, "part", pairs, spec["mu"], spec["sigma"], samplers, rng)
    bytes_per_pair = sum(p.stat().st_size for p in texts.values()) / 2 / pairs
    other = prefix.replace("de-en", "{}-en")
    # gzip level 1: a fast write; reading back (what is measured) takes about as long at any level
    with tarfile.open(path.with_suffix(".part"), "w:gz", compresslevel=1) as tar:
        for lang, other_pairs in spec["before"]:
            for side in (lang, "en"):
                _add(tar, f"{other.format(lang)}.{side}", round(other_pairs * scale * bytes_per_pair),
                     _Repeat(texts["en"]))
        for side in ("de", "en"):
            with open(texts[side], "rb") as source:
                _add(tar, f"{prefix}.{side}", texts[side].stat().st_size, source)
        for lang, other_pairs in spec["after"]:
            for side in (lang, "en"):
                _add(tar, f"{other.format(lang)}.{side}", round(other_pairs * scale * bytes_per_pair),
                     _Repeat(texts["en"]))
    os.replace(path.with_suffix(".part"), path)
    for text in texts.values():
        text.unlink()
    return pairs


def make_mirror(folder: Path, pairs: int, seed: int = 0) -> dict[str, Any]:
    """The synthetic statmt.org mirror for `pairs` EN-DE training pairs in `folder` (made once:
    `mirror.json`, written last, says it is complete and what it holds)."""
    done = folder / "mirror.json"
    if done.is_file():
        return json.loads(done.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    samplers = {lang: Sampler(words) for lang, words in vocabularies(rng).items()}
    scale = pairs / WMT14_PAIRS
    made = {}
    for url, prefix in WMT14_TRAIN_ARCHIVES:
        name = url.rsplit("/", 1)[-1]
        spec = next(spec for key, spec in ARCHIVES.items() if key in name)
        made[name] = write_archive(folder / name, prefix, spec, scale, folder, samplers, rng)
    for stem, n in NEWSTEST.items():
        write_pairs(folder, stem, n, 3.0, 0.6, samplers, rng)
    info = {"pairs": sum(made.values()), "archives": made, "seed": seed,
            "bytes": sum(p.stat().st_size for p in folder.iterdir()),
            "vocabulary": {lang: len(s.cdf) for lang, s in samplers.items()},
            "generated_s": round(time.perf_counter() - start, 1)}
    done.write_text(json.dumps(info, indent=1))
    return info


# ----------------------------------------------------------------------------------- serving

class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


class Mirror:
    """`folder` served over HTTP on 127.0.0.1 (a free port) from a daemon thread, while in `with`."""

    def __init__(self, folder: Path) -> None:
        self.server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self) -> Mirror:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


# ----------------------------------------------------------------------------------- the run

def _proc(pid: int) -> tuple[float, float] | None:
    """(RSS MB, user + system CPU seconds of every thread) of a live process, from /proc."""
    try:
        rss = next(int(line.split()[1]) / 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return rss, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, ValueError, IndexError, StopIteration):
        return None


_STAGE = re.compile(r"(\w+) ([\d.]+) s \(CPU ([\d.]+) s, peak RSS ([\d,]+|\?) MB\)")


def parse_stages(log: str) -> list[dict[str, Any]]:
    """The data stages from the run's `data preparation:` line (`describe_stages`)."""
    line = next((line for line in log.splitlines() if line.startswith("data preparation: ")), "")
    return [{"stage": name, "wall_s": float(wall), "cpu_s": float(cpu),
             "peak_rss_mb": None if peak == "?" else int(peak.replace(",", ""))}
            for name, wall, cpu, peak in _STAGE.findall(line)]


def rehearse(url: str, work: Path, name: str = "run", timeout_s: float = 7200) -> dict[str, Any]:
    """`ablate train --preset gpu --data wmt14 --base-url URL` in `work/NAME`, downloading into
    `work/cache`, stopped (SIGKILL) once its first step's checkpoint is written: its data stages,
    and its wall seconds, CPU seconds and sampled peak RSS up to then."""
    run = work / name
    cmd = [sys.executable, "-m", "ablate", "train", "--preset", "gpu", "--data", "wmt14",
           "--base-url", url, "--out", str(run), "--accelerator", "cpu", "--no-wandb", *MODEL,
           f"data.cache_dir={work / 'cache'}", "train.compile=false", "train.checkpoint_every=1"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    peak = cpu = 0.0
    with open(work / f"{name}.log", "w") as log:
        child = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            while True:
                if sample := _proc(child.pid):
                    peak, cpu = max(peak, sample[0]), sample[1]
                if child.poll() is not None or any((run / "checkpoints").glob("*.ckpt")):
                    break
                if time.perf_counter() - start > timeout_s:
                    raise RuntimeError(f"no first step after {timeout_s:.0f} s; see {work / f'{name}.log'}")
                time.sleep(0.1)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
    wall = time.perf_counter() - start
    text = (work / f"{name}.log").read_text()
    stages = parse_stages(text)
    if not stages or not any((run / "checkpoints").glob("*.ckpt")):
        raise RuntimeError(f"ablate train ended before its first step ({child.returncode}):\n{text[-3000:]}")
    return {"stages": stages, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "peak_rss_mb": round(peak),
            "summary": [line for line in text.splitlines()  # describe's lines, not the stage notes
                        if line.startswith(("model:", "data:", "data preparation:")) and " took " not in line]}


def stage_rows(pairs: int, measured: dict[str, Any], run: str) -> list[dict[str, Any]]:
    """One row per data stage, then the rest of the process to its first step (imports, model,
    Trainer, the first step) and the whole run to there."""
    stages = measured["stages"]
    rows = [{"pairs": pairs, "run": run, "stage": s["stage"], "wall s": s["wall_s"], "CPU s": s["cpu_s"],
             "peak RSS MB": s["peak_rss_mb"]} for s in stages]
    rows.append({"pairs": pairs, "run": run, "stage": "rest: imports, model, Trainer, first step",
                 "wall s": round(measured["wall_s"] - sum(s["wall_s"] for s in stages), 1),
                 "CPU s": round(measured["cpu_s"] - sum(s["cpu_s"] for s in stages), 1), "peak RSS MB": None})
    rows.append({"pairs": pairs, "run": run, "stage": "whole run to its first step", "wall s": measured["wall_s"],
                 "CPU s": measured["cpu_s"], "peak RSS MB": measured["peak_rss_mb"]})
    return rows


def run(settings: Settings) -> Section:
    scales = settings.pairs or ((20_000,) if settings.quick else (WMT14_PAIRS,))
    section = Section("wmt_rehearsal", "9. WMT14-scale rehearsal of the gpu preset's data path "
                      "(`ablate train --preset gpu --data wmt14 --base-url` a local mirror)",
                      ["pairs", "run", "stage", "wall s", "CPU s", "peak RSS MB"])
    root = settings.rehearsal_dir.expanduser()
    with stopwatch(section):
        for pairs in scales:
            folder = root / f"mirror-{pairs}"
            print(f"  {pairs:,} pairs: making the mirror in {folder} (once) ...", flush=True)
            mirror = make_mirror(folder, pairs)
            work = root / f"work-{pairs}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            with Mirror(folder) as served:
                measured = rehearse(served.url, work)
                following = rehearse(served.url, work, "next")  # a table's next run: the same data, its cache
            section.rows += stage_rows(mirror["pairs"], measured, "first") + \
                stage_rows(mirror["pairs"], following, "next")
            section.data[str(pairs)] = {
                "mirror": mirror, "run": measured, "next": following,
                "disk_mb": {"mirror": round(mirror["bytes"] / 2**20),
                            "cache": round(_size(work / "cache") / 2**20),
                            "run": round(_size(work / "run") / 2**20)}}
            print(f"  {pairs:,} pairs: {measured['cpu_s']:.0f} CPU s, peak {measured['peak_rss_mb']:,} MB; "
                  f"the next run {following['cpu_s']:.0f} CPU s, peak {following['peak_rss_mb']:,} MB", flush=True)
            if settings.quick or not settings.keep:
                shutil.rmtree(work, ignore_errors=True)
    section.notes += [
        "CPU s: user + system seconds of every thread (the primary figure on a shared machine); wall s "
        "indicative; peak RSS MB: each stage's own high-water mark (Linux clear_refs), the whole run's "
        "sampled every 0.1 s",
        "the model is 1 layer at d_model 32, stopped once its first step's checkpoint is written: the data "
        "path is the gpu preset's own (1M-pair subset, BPE vocabulary, spm_input_sentence_size, 25K-token "
        "batches); the first step on a CPU is the vocabulary projection of 25K tokens, not the data path",
        "download: the mirror's archives and newstest files over HTTP on 127.0.0.1 (a real mirror's "
        "bandwidth is not in it)",
        "run: the first on an empty data.cache_dir, then the next one (another run directory, the same "
        "data settings, as a table's next row or seed): it finds the download, the extraction, the BPE "
        "model and the encoded splits in the cache"]
    return section


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0
