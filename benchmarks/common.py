"""Shared pieces of the benchmarks: settings, timing, real batches, FLOPs and result sections.

Timing protocol: every candidate is warmed up, then the candidates run one after the other in
alternating order (A B C, C B A, ...) for `reps` repetitions, and each candidate's median is
reported. Batches come from the project's own data code: the Ding corpus (`load_corpus`), a
shared sentencepiece BPE trained once into the benchmark cache, and `TokenBucketBatchSampler` +
`collate` at the chosen `max_tokens`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from foundation.io import atomic_write_json, atomic_write_text
from lightning_modules.config import DataConfig, TrainConfig, TransformerConfig
from lightning_modules.data.batching import TokenBucketBatchSampler, collate
from lightning_modules.data.corpora import Corpus, load_corpus
from lightning_modules.data.datamodule import TranslationDataModule
from lightning_modules.run.environment import cpu_family, cpu_flags, cpu_model
from lightning_modules.translation import TranslationModule

Batch = dict[str, Tensor]
REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = Path("~/.cache/ablate/bench")
# Dense bf16 tensor-core peaks (FLOP/s) for MFU; matched by substring of the CUDA device name,
# first match wins (so the PCIe H100 entry precedes the SXM one).
PEAK_BF16_FLOPS: dict[str, float] = {
    "H100 PCIe": 756e12,
    "H100": 989e12,  # SXM
    "H200": 989e12,
    "A100": 312e12,
}
# Model sizes of the cases: the paper's base and big, and a tiny one for quick runs on a CPU
BASE = {"n_layers": 6, "d_model": 512, "d_ff": 2048, "n_heads": 8}
BIG = {"n_layers": 6, "d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3}
TINY = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 4}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # --precision's names
LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed"}  # what `ablate train` and a Trainer call them


@dataclass(frozen=True)
class Case:
    """One model at one vocabulary, measured at each of `tokens` (tokens per batch and side). The
    fields after `tokens` belong to one benchmark each; the other leaves them at their defaults."""

    name: str
    dims: dict[str, Any]
    vocab: int
    tokens: tuple[int, ...]
    # end_to_end: `ablate train` at tokens[0] (the other sizes: the bare step only) on this corpus
    corpus: str = "ding"  # "multi30k" | "newstest" (WMT-length text, see newstest_files) | "ding"
    steps: int = 200
    log_every: int = 20
    warm_cache: bool = False  # a third, compiled run that finds the first's compile cache
    # gpu_round: synthetic batches of WMT-like lengths
    max_len: int = 250  # longest sentence (pieces) of the synthetic pool
    pool: int = 120_000  # sentence pairs bucketed into batches (WMT14: 4.5M; batches of narrow length range)
    batches: int = 6  # batches per batch size
    passes: int = 3  # timed passes over them


@dataclass
class Settings:
    """What every benchmark needs to know about this invocation."""

    device: torch.device
    precision: str  # "fp32" | "bf16" (autocast): every benchmark's, the first of `precisions`
    reps: int | None  # None: each benchmark's own default
    quick: bool
    cache_dir: Path
    multi30k_dir: Path | None
    checkpoint: Path | None = None
    seed: int = 1
    newstest_dir: Path | None = None  # newstest2013/2014 (end_to_end's WMT-length cases)
    cases: tuple[str, ...] = ()  # end_to_end / gpu_round cases to run (empty: all)
    out: Path | None = None  # --out: where a benchmark that saves as it goes (gpu_round) writes
    budget_s: float | None = None  # --budget-s: gpu_round's time for its variants (None: its own)
    steps: tuple[tuple[str, str], ...] = ()  # --steps: gpu_round's (case, variant) or end_to_end's (case, run) pairs
    profile: bool = False  # --profile: gpu_round also profiles one pass of each variant
    precisions: tuple[str, ...] = ()  # --precision fp32,bf16: train, end_to_end and generation measure each

    def reps_or(self, default: int) -> int:
        return self.reps if self.reps is not None else default

    @property
    def compared(self) -> tuple[str, ...]:
        """The precisions measured side by side: `precisions`, else `precision` alone."""
        return self.precisions or (self.precision,)

    def label(self, name: str, precision: str) -> str:
        """`name`, and `precision` after it where several are measured side by side."""
        return name if len(self.compared) == 1 else f"{name}, {precision}"

    def autocast(self, precision: str | None = None) -> contextlib.AbstractContextManager:
        """bf16 autocast on request (`precision`, else this run's), nothing in fp32."""
        if (precision or self.precision) == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()


# ----------------------------------------------------------------------------------- timing

def sync(device: torch.device) -> None:
    """Wait for queued kernels so wall-clock time covers the work (CUDA is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def on_device(batch: Batch, device: torch.device, non_blocking: bool = False) -> Batch:
    """A batch with its tensors moved to `device` (other values as they are)."""
    return {k: v.to(device, non_blocking=non_blocking) if torch.is_tensor(v) else v for k, v in batch.items()}


def error_line(error: BaseException) -> str:
    """An exception as one short line ("Type: its first line"), for a result row that says why."""
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:300]}"


def free_memory(device: torch.device) -> None:
    """Drop what nothing references any more, and give the CUDA cache back, after a failed or finished variant."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def alternate(runs: dict[str, Callable[[], Any]], reps: int, device: torch.device,
              warmup: dict[str, Callable[[], Any]] | None = None) -> dict[str, list[float]]:
    """Seconds of each run per repetition, runs interleaved in alternating order.

    `warmup[name]` (default: the run itself, once) is called before any timing.
    """
    names = list(runs)
    for name in names:
        (warmup or {}).get(name, runs[name])()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in (names if rep % 2 == 0 else names[::-1]):
            sync(device)
            start = time.perf_counter()
            runs[name]()
            sync(device)
            times[name].append(time.perf_counter() - start)
    return times


def bare_step(c: TransformerConfig, t: TrainConfig, settings: Settings, lr: float,
              state: dict[str, torch.Tensor] | None = None, backend: str | None = None
              ) -> tuple[TranslationModule, Callable[[Batch], torch.Tensor]]:
    """The bare training step every benchmark times: a module (`state` loaded, else its own init,
    compiled with `backend` when `t.compile`), and its step on a batch already on the device:
    forward_loss, backward, Adam with `t`'s betas and eps at the constant rate `lr` (fused on
    CUDA); it returns the per-token loss, on the device."""
    device = settings.device
    seeded(settings.seed)
    module = TranslationModule.from_configs(c, t)
    if state is not None:
        module.load_state_dict(state)
    module.to(device)
    if t.compile:
        module.compile_step(*([backend] if backend else []))
    opt = torch.optim.Adam(module.parameters(), lr=lr, betas=(t.adam_beta1, t.adam_beta2), eps=t.adam_eps,
                           fused=True if device.type == "cuda" else None)

    def step(b: Batch) -> torch.Tensor:
        with settings.autocast():
            loss, _, n = module._forward_loss_fn(b["src"], b["tgt_in"], b["tgt_out"], c.label_smoothing)
        per_token = loss / n.clamp(min=1)
        per_token.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return per_token.detach()

    return module, step


def over_fp32(rates: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    """{(name, precision): rate} -> each rate over the same name's in fp32, fp32's own left out."""
    return {(name, p): rate / rates[name, "fp32"] for (name, p), rate in rates.items()
            if p != "fp32" and (name, "fp32") in rates}


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def spread(values: list[float]) -> float:
    """(max - min) / median: how noisy the repetitions were."""
    if len(values) < 2:
        return 0.0
    mid = median(values)
    return (max(values) - min(values)) / mid if mid else 0.0


# ----------------------------------------------------------------------------------- data

_CORPORA: dict[tuple, Corpus] = {}


class _BenchDataModule(TranslationDataModule):
    """The project's DataModule, with the raw corpus loaded once per process and shared."""

    def _load(self) -> Corpus:
        cfg = self.cfg
        key = (cfg.corpus, cfg.src_lang, cfg.tgt_lang, cfg.ding_path, cfg.valid_size,
               cfg.test_size, cfg.train_src, cfg.train_tgt, cfg.valid_src, cfg.valid_tgt)
        if key not in _CORPORA:
            _CORPORA[key] = load_corpus(cfg)
        return _CORPORA[key]


_MODULES: dict[tuple, TranslationDataModule] = {}


def data_module(settings: Settings, vocab_size: int, corpus: str = "ding",
                run_dir: Path | None = None, max_len: int = 512, **data: Any
                ) -> TranslationDataModule:
    """Corpus + BPE + encoded splits, set up once per process.

    The BPE model is `run_dir/spm.model` (a run's own), by default trained once into
    `cache_dir/CORPUS-VOCAB/spm.model` and reused.
    """
    key = (corpus, vocab_size, str(run_dir), max_len, tuple(sorted(data.items())))
    if key not in _MODULES:
        cfg = DataConfig(corpus=corpus, vocab_size=vocab_size, **data)
        if run_dir is None:
            run_dir = settings.cache_dir.expanduser() / f"{corpus}-{vocab_size}"
        dm = _BenchDataModule(cfg, run_dir, seed=settings.seed, max_len=max_len)
        dm.setup("fit")
        _MODULES[key] = dm
    return _MODULES[key]


def token_batches(dm: TranslationDataModule, max_tokens: int, count: int | None, seed: int = 1,
                  device: torch.device | None = None) -> list[Batch]:
    """The first `count` (None: all) batches of a shuffled epoch of token-bucketed training
    batches, as `ablate train` collates them (the data module's `pad_multiple` and shape buckets
    included)."""
    sampler = TokenBucketBatchSampler(dm.train_set.src_lengths, dm.train_set.tgt_lengths,
                                      max_tokens, shuffle=True, seed=seed, num_replicas=1, rank=0,
                                      pad_multiple=dm.pad_multiple, buckets=dm.buckets)
    batches = []
    for index in sampler.global_batches()[:count]:
        batch = collate([dm.train_set[i] for i in index], pad_id=dm.pad_id, pad_multiple=dm.pad_multiple,
                        buckets=sampler.buckets)
        batches.append(batch if device is None else on_device(batch, device))
    return batches


def remap_vocabulary(batches: list[Batch], from_vocab: int, to_vocab: int, seed: int = 0
                     ) -> list[Batch]:
    """The same batches with every ordinary id sent into [4, to_vocab) by one fixed random map.

    Shapes, padding, BOS/EOS and the token frequency profile stay those of the real batches;
    only the vocabulary grows (Ding cannot hold a 37,000-piece BPE).
    """
    generator = torch.Generator().manual_seed(seed)
    table = torch.arange(from_vocab)
    table[4:] = torch.randperm(to_vocab - 4, generator=generator)[: from_vocab - 4] + 4
    out = []
    for batch in batches:
        mapped = dict(batch)
        for name in ("src", "tgt_in", "tgt_out"):
            mapped[name] = table.to(batch[name].device)[batch[name]]
        out.append(mapped)
    return out


def random_batch(sentences: int, src_len: int, tgt_len: int, vocab: int,
                 device: torch.device, seed: int = 0) -> Batch:
    """Unpadded batch of random ids (for the scaling curves): src, tgt_in, tgt_out."""
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (sentences, src_len), generator=generator)
    tgt = torch.randint(4, vocab, (sentences, tgt_len + 1), generator=generator)
    tgt[:, 0] = 2
    return {"src": src.to(device), "tgt_in": tgt[:, :-1].contiguous().to(device),
            "tgt_out": tgt[:, 1:].contiguous().to(device),
            "n_tokens": sentences * tgt_len}


def batch_stats(batches: list[Batch], pad_id: int = 0) -> dict[str, float]:
    """Real (non-pad) source and target tokens, sentences and padding share of `batches`."""
    src = sum(int((b["src"] != pad_id).sum()) for b in batches)
    tgt = sum(int((b["tgt_out"] != pad_id).sum()) for b in batches)
    slots = sum(b["src"].numel() + b["tgt_out"].numel() for b in batches)
    return {"batches": len(batches), "sentences": sum(int(b["src"].size(0)) for b in batches),
            "src_tokens": src, "tgt_tokens": tgt,
            "padding_share": 1 - (src + tgt) / slots if slots else 0.0,
            "shapes": [[list(b["src"].shape), list(b["tgt_out"].shape)] for b in batches]}


# ----------------------------------------------------------------------------------- FLOPs

def forward_flops(c: TransformerConfig, batch: Batch) -> dict[str, float]:
    """Matmul FLOPs (2 per multiply-add) of one forward pass over the padded batch.

    Attention scores and attention-weighted values are counted in full (also the causal
    half that a masked kernel may skip); LayerNorm, softmax and the like are ignored.
    """
    b, s = batch["src"].shape
    t = batch["tgt_in"].size(1)
    d, h, dk, dv = c.d_model, c.n_heads, c.d_k, c.d_v
    proj = lambda rows, width_in, width_out: 2.0 * rows * width_in * width_out
    ffn = lambda rows: proj(rows, d, c.d_ff) + proj(rows, c.d_ff, d)
    scores = lambda q, k: 2.0 * b * h * q * k * (dk + dv)
    enc_linear = proj(b * s, d, h * (2 * dk + dv)) + proj(b * s, h * dv, d) + ffn(b * s)
    dec_linear = (proj(b * t, d, h * (2 * dk + dv)) + proj(b * t, h * dv, d)  # self
                  + proj(b * t, d, h * dk) + proj(b * s, d, h * (dk + dv))  # cross q, kv
                  + proj(b * t, h * dv, d) + ffn(b * t))
    attention = c.n_layers * (scores(s, s) + scores(t, t) + scores(t, s))
    linear = c.n_layers * (enc_linear + dec_linear) + proj(b * t, d, c.vocab_size)
    return {"attention": attention, "linear": linear, "total": attention + linear}


def train_flops(c: TransformerConfig, batch: Batch) -> float:
    """Forward + backward ≈ 3 × forward."""
    return 3.0 * forward_flops(c, batch)["total"]


def peak_flops(device: torch.device) -> tuple[str | None, float | None]:
    """(device name, dense bf16 peak) for a CUDA device in PEAK_BF16_FLOPS, else (name, None)."""
    if device.type != "cuda":
        return None, None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in name:
            return name, peak
    return name, None


def mfu(flops_per_s: float, device: torch.device) -> float | None:
    """Model FLOPs utilisation against the device's bf16 peak (CUDA only)."""
    _, peak = peak_flops(device)
    return flops_per_s / peak if peak else None


# ----------------------------------------------------------------------------------- machine

def _version(package: str) -> str | None:
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:
        return None


def machine_info(settings: Settings) -> dict[str, Any]:
    """Where and with what the numbers were taken."""
    try:
        git = lambda *args: subprocess.run(["git", *args], cwd=REPO, text=True,
                                           capture_output=True, timeout=10, check=False).stdout
        commit = git("rev-parse", "--short", "HEAD").strip() or None
        if commit and git("status", "--porcelain", "--untracked-files=no").strip():
            commit += "+dirty"
    except (OSError, subprocess.SubprocessError):
        commit = None
    gpu, peak = peak_flops(settings.device)
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_family": cpu_family(),
        "cpu_flags": cpu_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": _version("lightning"),
        "transformers": _version("transformers"),
        "device": str(settings.device),
        "gpu": gpu,
        "gpu_peak_bf16_flops": peak,
        "precision": ",".join(settings.compared),
        "quick": settings.quick,
        "git_commit": commit,
    }


# ----------------------------------------------------------------------------------- results

@dataclass
class Section:
    """One benchmark's result: a table (rows of dicts), targets, notes and raw data."""

    name: str
    title: str
    columns: list[str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    formats: dict[str, str] = field(default_factory=dict)  # column -> format spec, e.g. "{:.1%}"
    more: list["Section"] = field(default_factory=list)  # further tables, rendered after this one

    def target(self, name: str, value: float | None, goal: str, met: bool | None) -> None:
        """Record a target: `goal` in words (e.g. '≥ 1.3'), `met` None when not measurable."""
        self.targets.append({"benchmark": self.name, "target": name, "value": value,
                             "goal": goal, "met": met})

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows,
                "targets": self.targets, "notes": self.notes, "data": self.data,
                "seconds": round(self.seconds, 1), "more": [s.to_json() for s in self.more]}

    def save(self, out: Path | None) -> None:
        """`NAME.json` and `NAME.md` in `out` (`--out`; nothing without it), atomically: a benchmark
        that saves after each step keeps what it measured when it is cut short."""
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out / f"{self.name}.json", self.to_json())
            atomic_write_text(out / f"{self.name}.md", render_section(self) + "\n")


def fmt(value: Any) -> str:
    """Compact cell text: thousands separators, 3 significant decimals, ✓/✗ for booleans."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "✓" if value else "✗"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        if abs(value) >= 100:
            return f"{value:.1f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value).replace("|", "\\|")


def markdown_table(columns: list[str], rows: list[dict[str, Any]],
                   formats: dict[str, str] | None = None) -> str:
    formats = formats or {}

    def cell(row: dict[str, Any], col: str) -> str:
        value = row.get(col)
        if col in formats and isinstance(value, (int, float)) and not isinstance(value, bool):
            return formats[col].format(value)
        return fmt(value)

    head = "| " + " | ".join(columns) + " |"
    rule = "|" + "|".join(":--" if i == 0 else "--:" for i in range(len(columns))) + "|"
    body = ["| " + " | ".join(cell(row, col) for col in columns) + " |" for row in rows]
    return "\n".join([head, rule, *body])


def _target_value(target: dict[str, Any]) -> str:
    value = target["value"]
    if value is None:
        return ""
    if "%" in target["goal"]:
        return f"{value:.1%}"
    return f"{value:.2f} s" if target["goal"].endswith(" s") else f"{value:.2f}×"  # seconds, else a ratio


def render_section(section: Section) -> str:
    parts = [f"## {section.title}", "",
             markdown_table(section.columns, section.rows, section.formats)]
    if section.targets:
        parts += ["", markdown_table(["target", "value", "goal", "met"],
                                     [{"target": t["target"], "value": _target_value(t),
                                       "goal": t["goal"], "met": t["met"]}
                                      for t in section.targets])]
    parts += [""] + [f"- {note}" for note in section.notes]
    parts += ["\n" + render_section(more) for more in section.more]
    if section.seconds:
        parts.append(f"\n({section.seconds:.1f} s)")
    return "\n".join(parts)


@contextlib.contextmanager
def stopwatch(section: Section) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        section.seconds = time.perf_counter() - start


def seeded(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
