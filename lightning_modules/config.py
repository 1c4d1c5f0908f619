"""Configuration dataclasses: the single home of every knob.

`TransformerConfig` holds the architecture (the knobs Table 3 varies); `DataConfig`, `TrainConfig`
and `EvalConfig` hold everything else a run needs; `RunConfig` groups them. Validation lives in
`__post_init__`, so an impossible value is rejected wherever a config is built.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, NamedTuple

import yaml

from foundation.errors import UserError
from foundation.schema import stamped

POSITIONAL_KINDS = ("sinusoidal", "learned", "rope")
# The later modifications' knobs (docs/modifications.md); each tuple's first value is the paper's.
NORM_POSITIONS = ("post", "pre")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("relu", "gelu", "swiglu", "geglu")
GATED_ACTIVATIONS = ("swiglu", "geglu")
TIE_EMBEDDINGS = ("all", "decoder", "none")
# How the model computes, never what (docs/gpu-performance.md#kernel-variants): SDPA kernels of
# `model.attention_backend`, "auto" = PyTorch's own choice (transformer.SDPA_BACKENDS)
ATTENTION_BACKENDS = ("auto", "math", "flash", "efficient", "cudnn")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")  # torch.compile modes
ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")  # Lightning's names
# Lightning's precision names (lightning.fabric.connector._PRECISION_INPUT; tests/test_config.py
# keeps this list in step with it), and "auto". FP8 is "transformer-engine".
PRECISIONS = ("auto", "transformer-engine", "transformer-engine-float16", "16-true", "16-mixed",
              "bf16-true", "bf16-mixed", "32-true", "64-true", "64", "32", "16", "bf16")
# Positions a run's model needs at least: BOS or EOS plus a sentence's wordpieces. Below this the
# length filter leaves (nearly) no sentence of any corpus, and decoding has no room for a
# translation. (A model alone may be smaller: the unit tests build some.)
MIN_MAX_LEN = 16
MAX_SEED = 2 ** 32 - 1  # numpy's seeds, which Lightning's seed_everything takes: 0 .. 2**32 - 1
# The markers of fields that never change what a run trains or measures, which `computed_config`
# leaves out, so two runs that differ only in them are the same run of a table: where, or how
# often, a run writes or shows its output (logging, checkpoints, caches), and where its input is
# read from (a folder, a mirror, a file's path: two machines of one study may keep the same
# corpus in different places; a table compares the corpus's content instead,
# `tables.plan.check_data`).
OUTPUT_ONLY = {"not_trained": "output"}
LOCATION = {"not_trained": "location"}
RECIPE = {"not_trained": "recipe"}  # a rule that derives other fields, which hold what it gave


class CorpusEntry(NamedTuple):
    loader: str  # "module.function" of lightning_modules/data/: (DataConfig, Stages) -> Corpus
    disk_gb: float | None  # data.cache_dir at most, downloads and extracted text (None: the user's files)


# The corpora by their `data.corpus` name, the one place a corpus is registered (docs/corpora.md):
# each loader is imported when a corpus is loaded (data.corpora.load_corpus), so this module stays
# below the data package; the disk is for the dry run's plan.
CORPORA = {"ding": CorpusEntry("ding.load_ding", 0.1), "files": CorpusEntry("corpora.load_files", None),
           "multi30k": CorpusEntry("corpora.load_multi30k", 0.1), "wmt14": CorpusEntry("corpora.load_wmt14", 5.0)}


def check_seed(seed: int) -> None:
    """A seed Lightning's seed_everything takes, else one line."""
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"train.seed must be between 0 and {MAX_SEED}, got {seed}")


MAX_NUMBER = 10 ** 12  # no setting of a run is larger (a 401-digit warmup overflowed the float estimates)
# Counts bounded by what one run can use whatever the machine: each of these costs a process, a
# thread, a pass over a batch or a row of the beam, and their checks or the memory estimates
# would not stop a value of billions in time (a hang, a crash below Python, or a traceback).
COUNT_LIMITS = {"train.accumulate_grad_batches": 4096, "train.threads": 4096, "data.num_workers": 256,
                "eval.beam_size": 1024}


def _finite(owner: str, section: Any) -> None:
    """Every number of a config section is finite and at most `MAX_NUMBER` in size: NaN passes
    every `<=` check (`x <= 0` is False), and a NaN or infinite setting trained until its loss said
    so; and every count of `COUNT_LIMITS` is within its limit."""
    for f in fields(section):
        value = getattr(section, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{owner}.{f.name} must be a finite number, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
            raise UserError(f"{owner}.{f.name} must be at most {MAX_NUMBER:.0e} in size, got {str(value)[:20]}"
                            f"{'...' if len(str(value)) > 20 else ''}")
        limit = COUNT_LIMITS.get(f"{owner}.{f.name}")
        if limit is not None and isinstance(value, int) and value > limit:
            raise UserError(f"{owner}.{f.name} must be at most {limit:,}, got {value:,}")


def _positive(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if value is None or value <= 0:
            raise UserError(f"{owner}.{name} must be positive, got {value!r}")


def _one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise UserError(f"{key} must be one of {', '.join(choices)}; got {value!r}")


def parse_devices(text: str) -> str | int | list[int]:
    """`train.devices` as Lightning takes it: "auto", a count >= 1, or a list of device ids ("0,1")."""
    text = str(text).strip()
    if text == "auto":
        return text
    try:
        if "," in text:
            ids = [int(d) for d in text.split(",") if d.strip()]
            if ids and min(ids) >= 0 and len(set(ids)) == len(ids):
                return ids
        elif int(text) >= 1:
            return int(text)
    except ValueError:
        pass
    raise UserError(f"train.devices must be auto (every device), a count of at least 1, or a list of "
                    f"distinct device ids like 0,1; got {text!r}")


def run_devices(train: TrainConfig) -> int:
    """The devices one run trains on, over all its nodes ("auto" counts as one: how many it finds
    is the machine's)."""
    listed = parse_devices(train.devices)
    return (len(listed) if isinstance(listed, list) else listed if isinstance(listed, int) else 1) * train.num_nodes


def step_batches(train: TrainConfig) -> int:
    """The batches one optimizer step is split into: one per device and accumulated batch. They
    share the step's `data.max_tokens`, so a step trains on the same tokens on any number of devices."""
    return run_devices(train) * train.accumulate_grad_batches


def _unit_interval(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not 0.0 <= value < 1.0:
            raise UserError(f"{owner}.{name} must be in [0, 1), got {value!r}")


class Derived:
    """A value derived from other fields unless set explicitly (d_k and d_v: d_model / h;
    n_kv_heads: h), computed on every read and never stored.

    The explicit value (None when not set) is what `requested_model` returns and what a saved
    config.yaml holds, so changing d_model or h later derives the value again instead of
    keeping the one derived for the old model. (A dataclass field whose default is a descriptor:
    `TransformerConfig.d_k` on the class is None, the field's default.)
    """

    def __init__(self, derive: Any) -> None:
        self.derive = derive

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_set"

    def __get__(self, obj: Any, objtype: type | None = None) -> int | None:
        if obj is None:
            return None
        value = obj.__dict__.get(self.slot)
        return self.derive(obj) if value is None else value

    def __set__(self, obj: Any, value: int | None) -> None:
        obj.__dict__[self.slot] = value


@dataclass
class TransformerConfig:
    """Architecture of the encoder-decoder Transformer (names follow the paper).

    `d_k` and `d_v` read as d_model / h and `n_kv_heads` as h unless set (see `Derived`);
    `vocab_size` and `pad_id` belong to the tokenizer (`TOKENIZER_KEYS`): a run sets them from its
    BPE model (`with_vocabulary`), a user sets data.vocab_size. The knobs after `pad_id` are later
    modifications (docs/modifications.md), the paper's model by default.
    """

    n_layers: int = 6  # N, in both encoder and decoder
    d_model: int = 512
    d_ff: int = 2048
    n_heads: int = 8  # h
    # per-head query/key and value sizes; default d_model / h
    d_k: int | None = Derived(lambda c: c.d_model // c.n_heads)  # type: ignore[assignment]
    d_v: int | None = Derived(lambda c: c.d_model // c.n_heads)  # type: ignore[assignment]
    dropout: float = 0.1  # P_drop
    label_smoothing: float = 0.1  # eps_ls
    positional: str = "sinusoidal"  # "sinusoidal" | "learned" | "rope" (rotary, in self-attention)
    max_len: int = 512  # longest sequence (positions) the model accepts
    vocab_size: int = 37000  # shared source/target vocabulary
    pad_id: int = 0
    norm_position: str = "post"  # "post": LN(x + Sublayer(x)) | "pre": x + Sublayer(LN(x)), final LN
    norm: str = "layernorm"  # "layernorm" | "rmsnorm"
    # "relu" | "gelu" | "swiglu" | "geglu"; gated: d_ff is the width of each of its two input projections
    activation: str = "relu"
    # one matrix for "all" of encoder input, decoder input and pre-softmax; "decoder": decoder input
    # and pre-softmax only; "none": three matrices
    tie_embeddings: str = "all"
    scale_embeddings: bool = True  # multiply embeddings by sqrt(d_model)
    # key/value heads, each shared by n_heads / n_kv_heads query heads: 1 = multi-query,
    # a divisor of h = grouped-query; default h
    n_kv_heads: int | None = Derived(lambda c: c.n_heads)  # type: ignore[assignment]
    # Kernel choices (docs/gpu-performance.md#kernel-variants): the same function and parameters, other kernels.
    # The SDPA kernel tried first: "auto" (PyTorch's order) | "math" | "flash" | "efficient" | "cudnn";
    # a call it does not take (flash: a padding mask) falls to the next in PyTorch's order
    attention_backend: str = "auto"
    fused_qkv: bool = False  # self-attention's W_q and W_kv as one matrix, one matmul (state_dict: w_qkv)
    # Under autocast, the residual stream (the embeddings and each sub-layer's output) in autocast's
    # dtype (bf16) instead of fp32: half its bytes, its sums rounded to bf16; nothing without autocast
    residual_bf16: bool = False

    def __post_init__(self) -> None:
        _positive("model", n_layers=self.n_layers, d_model=self.d_model, d_ff=self.d_ff,
                  n_heads=self.n_heads, max_len=self.max_len, vocab_size=self.vocab_size)
        if set(self.derived_keys()) & set(HEAD_SIZE_KEYS) and self.d_model % self.n_heads:
            raise UserError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads="
                f"{self.n_heads}; set model.d_k and model.d_v explicitly")
        _positive("model", d_k=self.d_k, d_v=self.d_v)
        _finite("model", self)  # after the sizes that its derived fields divide by
        _unit_interval("model", dropout=self.dropout, label_smoothing=self.label_smoothing)
        for key, choices in (("positional", POSITIONAL_KINDS), ("norm_position", NORM_POSITIONS),
                             ("norm", NORMS), ("activation", ACTIVATIONS),
                             ("tie_embeddings", TIE_EMBEDDINGS)):
            _one_of(f"model.{key}", getattr(self, key), choices)
        _one_of("model.attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        for key in ("scale_embeddings", "fused_qkv", "residual_bf16"):
            if not isinstance(getattr(self, key), bool):
                raise UserError(f"model.{key} must be true or false, got {getattr(self, key)!r}")
        _positive("model", n_kv_heads=self.n_kv_heads)
        if self.n_heads % self.n_kv_heads:
            raise UserError(f"model.n_kv_heads={self.n_kv_heads} does not divide model.n_heads="
                            f"{self.n_heads}: each key/value head serves an equal group of query heads")
        if self.positional == "rope" and self.d_k % 2:
            raise UserError(f"model.positional=rope rotates pairs of query/key dimensions: it needs an "
                            f"even model.d_k, got {self.d_k}")
        if not 0 <= self.pad_id < self.vocab_size:
            raise UserError(f"model.pad_id={self.pad_id} is outside the vocabulary "
                            f"(size {self.vocab_size})")

    def derived_keys(self) -> tuple[str, ...]:
        """The derived keys not set explicitly (head sizes read as d_model / h, n_kv_heads as h)."""
        return tuple(k for k in DERIVED_KEYS if self.__dict__.get(f"_{k}_set") is None)

    def requested(self) -> dict[str, Any]:
        """The fields as set: derived keys are None (`asdict` gives the values in use)."""
        values = asdict(self)
        values.update({key: None for key in self.derived_keys()})
        return values

    def with_vocabulary(self, vocab_size: int, pad_id: int) -> "TransformerConfig":
        """The same architecture (explicit and derived keys alike) for a tokenizer's vocabulary."""
        return TransformerConfig(**{**self.requested(), "vocab_size": vocab_size, "pad_id": pad_id})


HEAD_SIZE_KEYS = ("d_k", "d_v")  # derived from d_model / h unless set
DERIVED_KEYS = (*HEAD_SIZE_KEYS, "n_kv_heads")  # n_kv_heads: h unless set
TOKENIZER_KEYS = ("vocab_size", "pad_id")  # a run's tokenizer decides them, never its config


@dataclass
class DataConfig:
    """Corpus, tokenizer and batching."""

    corpus: str = "ding"  # ding | files | multi30k | wmt14
    src_lang: str = "en"
    tgt_lang: str = "de"
    ding_path: str = field(default="/usr/share/trans/de-en", metadata=LOCATION)
    ding_dictionary: bool = False  # add the dictionary's word/phrase pairs to the training split
    valid_size: int = 1000  # held-out pairs for the Ding corpus
    test_size: int = 1000
    # --data files: one source and one target file per split (plain text or .gz)
    train_src: str | None = field(default=None, metadata=LOCATION)
    train_tgt: str | None = field(default=None, metadata=LOCATION)
    valid_src: str | None = field(default=None, metadata=LOCATION)
    valid_tgt: str | None = field(default=None, metadata=LOCATION)
    test_src: str | None = field(default=None, metadata=LOCATION)
    test_tgt: str | None = field(default=None, metadata=LOCATION)
    # --data multi30k | wmt14: a local directory with the files, or a mirror URL
    data_dir: str | None = field(default=None, metadata=LOCATION)
    base_url: str | None = field(default=None, metadata=LOCATION)
    cache_dir: str = field(default="~/.cache/ablate", metadata=OUTPUT_ONLY)
    vocab_size: int = 37000  # sentencepiece BPE vocabulary, shared by both languages
    spm_input_sentence_size: int = 2_000_000  # sentences sampled to train the BPE model
    # tokens per side of one optimizer step, padding included (the paper's 25,000; fairseq's
    # --max-tokens x its GPUs): shared by the devices a run trains on and its accumulated
    # batches, so each of those holds max_tokens / (devices x train.accumulate_grad_batches)
    max_tokens: int = 25000
    max_train_len: int = 256  # drop training pairs longer than this (in wordpieces)
    # train on a fixed random subset of this many training pairs (the same for every row and
    # seed; the dev and test sets are untouched); None = all of them
    train_pairs: int | None = None
    num_workers: int = 0
    # round each batch's lengths up to a multiple of this (fewer tensor shapes). 1 = exact lengths,
    # faster on a GPU than multiples of 8, which pad more (the GPU pages of benchmarks/README.md);
    # the compiled step takes any shape.
    pad_multiple: int = 1
    # static batch shapes for CUDA graphs (train.compile_mode=reduce-overhead): each side's lengths
    # padded up to one of this many lengths fitted to the training corpus (multiples of
    # pad_multiple), rows fixed per (source, target) length cell; 0 = off (exact lengths). More
    # buckets pad less and make more shapes (docs/gpu-performance.md#static-shapes-and-cuda-graphs)
    shape_buckets: int = 0

    def __post_init__(self) -> None:
        _finite("data", self)
        if self.corpus not in CORPORA:
            raise UserError(f"data.corpus must be one of {', '.join(CORPORA)}, "
                            f"got {self.corpus!r}")
        _positive("data", vocab_size=self.vocab_size, max_tokens=self.max_tokens,
                  max_train_len=self.max_train_len, valid_size=self.valid_size,
                  test_size=self.test_size, spm_input_sentence_size=self.spm_input_sentence_size)
        if self.num_workers < 0:
            raise UserError(f"data.num_workers must be >= 0, got {self.num_workers}")
        if self.pad_multiple < 1:
            raise UserError(f"data.pad_multiple must be >= 1, got {self.pad_multiple}")
        if self.shape_buckets < 0:
            raise UserError(f"data.shape_buckets must be >= 0 (0 = off), got {self.shape_buckets}")
        if self.train_pairs is not None:
            _positive("data", train_pairs=self.train_pairs)


@dataclass
class TrainConfig:
    """Optimisation and the Lightning Trainer."""

    max_steps: int = 100_000
    warmup_steps: int = 4000  # 0: no warmup, the formula's rsqrt decay from step 1 (translation.noam_lrate)
    lr_scale: float = 1.0  # multiplies the paper's lrate (1.0 = the paper)
    lr_decay: str = "rsqrt"  # after warmup: "rsqrt" (the paper) or "cosine" (to zero at max_steps)
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-9
    accumulate_grad_batches: int = 1  # split each device's share of a step into this many batches (memory)
    gradient_clip_val: float = 0.0  # 0 = off, as in the paper
    val_check_interval: int = 1000  # validate (dev perplexity) every this many steps
    # save a resumable checkpoint every this many steps (a resumed run trains on as if never stopped)
    checkpoint_every: int = field(default=1000, metadata=OUTPUT_ONLY)
    # keep the last K of those step checkpoints (besides last.ckpt), for `--checkpoint average:K`
    # (the paper's Table 2 averages the last 5 for base, 20 for big, written every 10 minutes)
    keep_checkpoints: int = field(default=1, metadata=OUTPUT_ONLY)
    log_every_n_steps: int = field(default=50, metadata=OUTPUT_ONLY)  # log the window means this often
    seed: int = 1
    accelerator: str = "auto"
    devices: str = "auto"  # "auto", a count ("2") or a list ("0,1")
    strategy: str = "auto"  # "auto" picks DDP for several devices
    # "auto": bf16-mixed on a GPU that supports it, else 32-true. bf16-mixed on a CPU: CPU autocast,
    # refused on a CPU without native bf16 (run/environment.NATIVE_BF16), where it is emulated
    precision: str = "auto"
    num_nodes: int = 1
    # torch.compile the training step (model + loss): None = auto, on for CUDA runs of at least
    # COMPILE_MIN_STEPS steps (compiling costs minutes once; short runs stay eager)
    compile: bool | None = None
    # torch.compile's mode for that step: default | reduce-overhead (CUDA graphs: needs
    # data.shape_buckets) | max-autotune-no-cudagraphs
    compile_mode: str = "default"
    # torch.use_deterministic_algorithms (warn-only: an op without a deterministic kernel warns).
    # None = auto: on for CPU runs, where it costs little (no CPU op of a step needs it: the
    # reproducibility row of benchmarks/README.md); off on GPUs, where deterministic kernels can
    # cost more: turn it on there to compare runs.
    deterministic: bool | None = None
    # torch's intra-op threads; None = torch's default (the cores, or $OMP_NUM_THREADS). The order
    # in which matmuls and reductions add up depends on it: pin it to reproduce a run bit for bit.
    threads: int | None = None
    # auto (online with an API key, else offline) | online | offline | off
    wandb: str = field(default="auto", metadata=OUTPUT_ONLY)
    wandb_project: str = field(default="transformer-ablations", metadata=OUTPUT_ONLY)
    wandb_group: str | None = field(default=None, metadata=OUTPUT_ONLY)
    # online without a valid API key: "fail" or fall back to "offline"
    wandb_on_error: str = field(default="fail", metadata=OUTPUT_ONLY)
    max_memory_gb: float | None = None  # refuse configurations whose estimated training memory exceeds this
    progress_bar: bool = field(default=True, metadata=OUTPUT_ONLY)
    # Under SLURM (SLURM_NTASKS set): SIGUSR1 (`#SBATCH --signal=USR1@90`) saves a checkpoint at
    # the end of the step, requeues the job (`scontrol requeue`) and stops; see run/slurm.py
    slurm_requeue: bool = True
    # 0: the vocabulary projection's logits (N, V) in full, then the loss (loss.label_smoothed_nll).
    # K >= 1: projection and label-smoothed loss in K row chunks, each chunk's gradients formed at
    # once, never the full logits (loss.projected_label_smoothed_nll); the same loss, other kernels
    loss_chunks: int = 0

    def __post_init__(self) -> None:
        _finite("train", self)
        if self.warmup_steps < 0:
            raise UserError(f"train.warmup_steps must be 0 (no warmup) or more, got {self.warmup_steps}")
        _positive("train", max_steps=self.max_steps,
                  lr_scale=self.lr_scale, adam_eps=self.adam_eps,
                  accumulate_grad_batches=self.accumulate_grad_batches,
                  val_check_interval=self.val_check_interval,
                  checkpoint_every=self.checkpoint_every, keep_checkpoints=self.keep_checkpoints,
                  log_every_n_steps=self.log_every_n_steps, num_nodes=self.num_nodes)
        _unit_interval("train", adam_beta1=self.adam_beta1, adam_beta2=self.adam_beta2)
        if self.lr_decay not in ("rsqrt", "cosine"):
            raise UserError(f"train.lr_decay must be rsqrt or cosine, got {self.lr_decay!r}")
        if self.gradient_clip_val < 0:
            raise UserError(f"train.gradient_clip_val must be >= 0, got {self.gradient_clip_val}")
        if self.wandb not in ("auto", "online", "offline", "off"):
            raise UserError(f"train.wandb must be auto, online, offline or off, got {self.wandb!r}")
        if self.wandb_on_error not in ("fail", "offline"):
            raise UserError(f"train.wandb_on_error must be fail or offline, got {self.wandb_on_error!r}")
        if self.max_memory_gb is not None:
            _positive("train", max_memory_gb=self.max_memory_gb)
        check_seed(self.seed)
        _one_of("train.accelerator", self.accelerator, ACCELERATORS)
        _one_of("train.precision", self.precision, PRECISIONS)
        _one_of("train.compile_mode", self.compile_mode, COMPILE_MODES)
        parse_devices(self.devices)
        if self.threads is not None:
            _positive("train", threads=self.threads)
        if isinstance(self.loss_chunks, bool) or not isinstance(self.loss_chunks, int) or self.loss_chunks < 0:
            raise UserError(f"train.loss_chunks must be 0 (off) or a count of chunks >= 1, got {self.loss_chunks!r}")


@dataclass
class EvalConfig:
    """Decoding and scoring (the paper: beam 4, alpha 0.6, max length = source + 50)."""

    beam_size: int = 4
    length_penalty: float = 0.6  # GNMT alpha
    max_len_offset: int = 50  # output may be up to source length + this many tokens
    batch_tokens: int = 8000  # source tokens per decoding batch
    bleu_tokenize: str = "13a"  # sacreBLEU tokenizer ("13a", "intl", ...)
    decode_test: bool = True  # also translate and score the test split
    # decode through fixed-size caches, each batch's step replayed as one CUDA graph on a GPU
    # (decoding a small model is bound by kernel launches); the same numbers, without a graph, on a CPU
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        _finite("eval", self)
        _positive("eval", beam_size=self.beam_size, batch_tokens=self.batch_tokens)
        if not 0 <= self.length_penalty < float("inf"):  # nan too: it decoded repeated tokens
            raise UserError(f"eval.length_penalty (--alpha) must be a finite number >= 0, got {self.length_penalty}")
        if self.max_len_offset < 0:
            raise UserError("eval.length_penalty and eval.max_len_offset must be >= 0")
        _one_of("eval.bleu_tokenize", self.bleu_tokenize, bleu_tokenizers())


def bleu_tokenizers() -> tuple[str, ...]:
    """sacreBLEU's tokenizer names (its BLEU metric fails on any other only when scoring)."""
    from sacrebleu.metrics.bleu import BLEU  # imported here, so that `ablate --help` does not load it

    return tuple(BLEU.TOKENIZERS)


@dataclass
class ScaleConfig:
    """How a preset scales every Table 3 row: one rule, applied to all rows alike.

    Widths (d_model, d_ff, d_k, d_v) are multiplied by `width`, depth N by `depth` and the row's
    training steps by `steps`; heads, dropout, label smoothing and positions are kept.
    """

    width: float = 1.0
    depth: float = 1.0
    steps: float = 1.0

    def __post_init__(self) -> None:
        _finite("scale", self)
        _positive("scale", width=self.width, depth=self.depth, steps=self.steps)


@dataclass
class RunConfig:
    """Everything one training run needs; saved as `config.yaml` in the run directory
    (`requested_config`: what was asked for, never a derived value)."""

    row: str = "base"
    preset: str = "paper"
    model: TransformerConfig = field(default_factory=TransformerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # how the preset scaled the row (widths, depth, steps): the sizes it gave are the run's, so two
    # routes to the same sizes (a preset's rule, --max-steps on a table) are the same run
    scale: ScaleConfig = field(default_factory=ScaleConfig, metadata=RECIPE)

    def __post_init__(self) -> None:
        if self.train.compile_mode == "reduce-overhead" and not self.data.shape_buckets:
            raise UserError("train.compile_mode=reduce-overhead (CUDA graphs) records a graph per batch "
                            "shape: it needs static shapes, data.shape_buckets > 0 (e.g. 24)")
        if self.train.compile_mode != "default" and not self.train.compile:
            raise UserError(f"train.compile_mode={self.train.compile_mode} is the compiled step's mode: add "
                            "train.compile=true (without it the step runs eagerly and the mode would be ignored)")
        if self.model.max_len < MIN_MAX_LEN:
            raise UserError(f"model.max_len={self.model.max_len} is too short for a run: it needs at least "
                            f"{MIN_MAX_LEN} positions (a sentence's wordpieces plus BOS/EOS)")


def requested_config(cfg: RunConfig) -> dict[str, Any]:
    """The run's configuration as asked for, for config.yaml: head sizes that are derived are
    None (they follow d_model and h when the file is loaded with other overrides), and the
    tokenizer's keys are left out (data.vocab_size is the choice; the model gets the tokenizer's)."""
    out = {f.name: getattr(cfg, f.name) for f in fields(cfg)}
    out = {k: asdict(v) if hasattr(v, "__dataclass_fields__") else v for k, v in out.items()}
    out["model"] = {k: v for k, v in cfg.model.requested().items() if k not in TOKENIZER_KEYS}
    return out


def computed_config(cfg: RunConfig) -> dict[str, Any]:
    """`requested_config` less the fields marked OUTPUT_ONLY, LOCATION or RECIPE: what the run trains and
    measures. Two runs with equal ones are the same run of a table (`tables.plan.identity`)."""
    return trained_part(requested_config(cfg))


def trained_part(values: dict[str, Any], owner: Any = None) -> dict[str, Any]:
    """A configuration as stored (`requested_config`'s nesting; a study's record of one) less the
    fields marked OUTPUT_ONLY, LOCATION or RECIPE; keys the config does not know stay as they are."""
    owner = RunConfig() if owner is None else owner
    known = {f.name: f for f in fields(owner)}
    kept = {}
    for name, value in values.items():
        f = known.get(name)
        if f is not None and f.metadata.get("not_trained"):
            continue
        part = getattr(owner, name) if f is not None else None
        kept[name] = trained_part(value, part) if is_dataclass(part) and isinstance(value, dict) else value
    return kept


def model_identity(model: dict[str, Any]) -> dict[str, Any]:
    """The architecture a `model` section (config.yaml's: derived head sizes None; results.json's:
    every value filled in) builds, without the tokenizer's keys: what makes two run directories the
    same model."""
    known = {f.name for f in fields(TransformerConfig)} - set(TOKENIZER_KEYS)
    built = TransformerConfig(**{k: v for k, v in model.items() if k in known})
    return {k: v for k, v in asdict(built).items() if k not in TOKENIZER_KEYS}


MODIFICATION_KEYS = ("norm_position", "norm", "activation", "tie_embeddings", "scale_embeddings", "n_kv_heads")


def modifications(c: TransformerConfig) -> str:
    """The later modifications' knobs where `c` differs from the paper's model, 'norm=rmsnorm,
    n_kv_heads=1' ('' for the paper's; positions, row E's knob too, are shown on their own)."""
    paper = TransformerConfig(n_heads=c.n_heads, d_model=c.d_model, d_k=c.d_k, d_v=c.d_v)
    changed = [(key, getattr(c, key)) for key in MODIFICATION_KEYS if getattr(c, key) != getattr(paper, key)]
    return ", ".join(f"{key}={str(value).lower() if isinstance(value, bool) else value}"
                     for key, value in changed)


def count_parameters(c: TransformerConfig) -> int:
    """Closed-form parameter count of `Transformer(c)` (weights + biases, every knob)."""
    d, h, g = c.d_model, c.n_heads, c.n_kv_heads
    attention = d * h * c.d_k + h * c.d_k + d * g * (c.d_k + c.d_v) + g * (c.d_k + c.d_v) \
        + h * c.d_v * d + d
    input_projections = 2 if c.activation in GATED_ACTIVATIONS else 1
    ffn = input_projections * (d * c.d_ff + c.d_ff) + c.d_ff * d + d
    norm = 2 * d if c.norm == "layernorm" else d  # RMSNorm: a gain, no bias
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    final_norms = 2 * norm if c.norm_position == "pre" else 0
    positions = 2 * c.max_len * d if c.positional == "learned" else 0
    embeddings = {"all": 1, "decoder": 2, "none": 3}[c.tie_embeddings] * c.vocab_size * d
    return embeddings + positions + c.n_layers * (encoder_layer + decoder_layer) + final_norms


def to_yaml(cfg: RunConfig) -> str:
    """config.yaml: the configuration as asked for (`requested_config`), no derived value, and the
    schema version (`foundation.schema`)."""
    return yaml.safe_dump(stamped(requested_config(cfg)), sort_keys=False)
