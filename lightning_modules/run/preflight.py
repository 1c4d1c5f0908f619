"""Checks before a run does any work: the hardware it asks for, the output directory, its identity,
memory, disk, W&B, and the checkpoints it would resume from. Each failure is one `UserError` line.

Lightning is imported inside the checks that need it: `check_hardware` and `prepare_data`, which the
commands that queue a table or a sweep run before queueing anything, load none (about 3 s).
"""

from __future__ import annotations

import errno
import netrc
import os
import sys
import shutil
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from lightning_modules.config import (RunConfig, TransformerConfig, count_parameters, model_identity,
                                      parse_devices, step_batches)
from foundation.errors import DiskFull, UserError
from foundation.io import is_temporary, set_aside
from foundation.rundir import CONFIG, MARKER, saved_config
from lightning_modules.run.environment import NATIVE_BF16, native_bf16
from lightning_modules.run.results import RunResult

# What makes a run directory one run: the whole model (all keys, as built: see model_identity)
# and the corpus and vocabulary.
IDENTITY_KEYS: dict[str, list[str]] = {
    "model": [],
    "data": ["corpus", "src_lang", "tgt_lang", "ding_dictionary", "valid_size", "test_size",
             "train_src", "train_tgt", "valid_src", "valid_tgt", "test_src", "test_tgt", "vocab_size"],
}
GB = 1024 ** 3


def uses_gpu(cfg: RunConfig) -> bool:
    """Whether this run will train on CUDA devices."""
    return torch.cuda.is_available() and cfg.train.accelerator in ("auto", "gpu", "cuda")


def check_gpu_ids(ids: list[int], what: str) -> None:
    """Fail unless every id names a CUDA GPU visible here (`what`: the setting, for the message)."""
    visible = torch.cuda.device_count()
    if not visible:
        raise UserError(f"{what} names GPU ids, but no CUDA GPU is visible on this machine")
    missing = [i for i in ids if i >= visible]
    if missing:
        raise UserError(f"{what}: no GPU {missing[0]} here ({visible} visible: ids 0 to {visible - 1})")


def check_hardware(cfg: RunConfig) -> None:
    """Fail before any work if the accelerator, devices, strategy or precision cannot be had on this
    machine (Lightning itself would say so only once the data is loaded and the run directory
    written; and it trains bf16 on any CPU, emulated where the CPU has no bf16 arithmetic)."""
    t = cfg.train
    if t.accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise UserError(f"train.accelerator={t.accelerator}, but no CUDA GPU is visible on this machine; "
                        f"use --accelerator cpu (or auto)")
    if t.precision.startswith("bf16") and not uses_gpu(cfg) and not native_bf16():
        raise UserError(f"train.precision={t.precision} on this CPU would be emulated, slower than 32-true: "
                        f"its flags have neither {' nor '.join(NATIVE_BF16)}; train in 32-true (the CPU's default)")
    devices = parse_devices(t.devices)
    if isinstance(devices, list):
        if not uses_gpu(cfg):
            raise UserError(f"train.devices={t.devices} lists GPU ids, but this run trains on the CPU; "
                            f"give a count of processes instead (e.g. train.devices=2)")
        check_gpu_ids(devices, f"train.devices={t.devices}")
    elif isinstance(devices, int) and uses_gpu(cfg) and devices > torch.cuda.device_count():
        raise UserError(f"train.devices={devices}, but only {torch.cuda.device_count()} GPU(s) are visible")
    if t.strategy == "auto":
        return
    from lightning.pytorch.strategies import StrategyRegistry

    strategies = ("auto", *StrategyRegistry.available_strategies())
    if t.strategy not in strategies:
        raise UserError(f"train.strategy must be auto or one of Lightning's strategies "
                        f"({', '.join(strategies[1:])}); got {t.strategy!r}")


def check_cores(cfg: RunConfig) -> None:
    """What this machine's cores can run, checked where a run is about to train (a plan made on a
    laptop for a cluster is not held to the laptop): CPU training processes (`train.devices` as a
    count, off the GPU), threads and data-loading processes, each at most the cores this process
    may use (`slurm.task_cores`: a SLURM task's --cpus-per-task). Beyond them they only contend:
    `train.devices=99` had started 99 processes on 2 cores."""
    from lightning_modules.run.slurm import task_cores

    cores = task_cores()
    devices = parse_devices(cfg.train.devices)
    asked = {"train.threads": cfg.train.threads or 0, "data.num_workers": cfg.data.num_workers,
             "train.devices": devices if isinstance(devices, int) and not uses_gpu(cfg) else 0}  # on this node
    for key, count in asked.items():
        if count > cores:
            raise UserError(f"{key}={count} asks for more than the {cores} cores this process may use "
                            f"(one {'process' if key != 'train.threads' else 'thread'} a core at most)")


def prepare_data(cfg: RunConfig) -> str:
    """Prepare the data as the run would (corpus, BPE, encoding, length filter) in a scratch
    directory that is then removed: a corpus that cannot be read, a vocabulary it cannot hold or a
    length limit that leaves no pairs fails here, once, before a sweep or a table queues anything.
    The BPE model and the encoded splits stay in the preparation cache (`data.cache`) for the runs.
    One process at a time prepares a corpus in a cache folder (`data.cache.alone`): the tasks of a
    SLURM array wait for the first, then read its download, BPE model and encoded splits. Returns
    the corpus's digest (`TranslationData.corpus_digest`)."""
    from lightning_modules.data import cache
    from lightning_modules.data.prepared import TranslationData  # the data stack: only here

    def waiting(lock: Path) -> None:
        print(f"waiting for another process that prepares the {cfg.data.corpus} corpus in "
              f"{cfg.data.cache_dir} (it holds {lock}); then reading what it prepared", file=sys.stderr, flush=True)

    with cache.alone(cfg.data.cache_dir, f"prepare-{cfg.data.corpus}", waiting), \
            tempfile.TemporaryDirectory(prefix="ablate-data-check-") as scratch:
        data = TranslationData(cfg.data, scratch, seed=cfg.train.seed, max_len=cfg.model.max_len,
                               pad_multiple=cfg.data.pad_multiple)
        data.setup("fit")
        return data.corpus_digest()


def check_output_dir(out: Path) -> None:
    """Fail before any work if the run directory cannot be written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):  # the environment, not the input: exit status 1
            raise DiskFull(f"{out}: the disk is full ({err.strerror}); free some space and run the same "
                           f"command again") from None
        raise UserError(f"cannot write to output directory {out}: {err.strerror or err}") from None


def remove_stale_temporaries(out: Path) -> None:
    """Delete the temporary files of atomic writes that a killed process left (rank 0 only, with
    the run's lock held), but not the marker's: a second `ablate train` on the same folder writes
    the marker (`rundir.claim`) before it finds the run taken, and may be writing it just now."""
    from lightning.pytorch.utilities import rank_zero_only

    if rank_zero_only.rank != 0:
        return
    for folder in (out, out / "checkpoints"):
        for tmp in folder.glob(".*.tmp"):  # ours only (mkstemp's pattern): a user's `.draft.tmp` is not
            if is_temporary(tmp.name) and not is_temporary(tmp.name, MARKER) and not tmp.is_symlink():
                tmp.unlink(missing_ok=True)


def check_same_run(out: Path, cfg: RunConfig) -> None:
    """A run directory belongs to one model and corpus: refuse to resume a different one."""
    saved_path = out / CONFIG
    if not saved_path.is_file():
        return
    saved = saved_config(out)
    if saved is None or not all(isinstance(saved.get(s), dict) for s in IDENTITY_KEYS):
        set_aside(saved_path, "not the configuration a run writes")  # a new one is written
        return
    current = asdict(cfg)
    for section, keys in IDENTITY_KEYS.items():
        old, new = saved.get(section) or {}, current[section]
        if section == "model":
            try:
                old = model_identity(old)
            except (TypeError, UserError):  # not a model this version can build: not this run's
                old = {}
            new = model_identity(new)
        for key in keys or list(new):
            if old.get(key) != new.get(key):
                raise UserError(
                    f"{out} holds a run with {section}.{key}={old.get(key)!r}, not {new.get(key)!r}; "
                    f"use another --out (or delete {out}) to train a different configuration")


def check_same_result(out: Path, done: RunResult, cfg: RunConfig) -> None:
    """A finished run's results.json is reused only by the configuration that produced it: one
    restored or copied into a run directory without its config.yaml (`tables.archive`) is checked
    against the preset, corpus, seed, steps and model asked for."""
    asked = {"preset": cfg.preset, "corpus": cfg.data.corpus, "seed": cfg.train.seed,
             "steps": cfg.train.max_steps}
    asked.update({f"model.{k}": v for k, v in model_identity(asdict(cfg.model)).items()})
    try:
        model = model_identity(done.model or {})
    except (TypeError, UserError):  # a model this version cannot build: not this run's
        model = {}
    found = {**{key: getattr(done, key) for key in ("preset", "corpus", "seed", "steps")},
             **{f"model.{k}": v for k, v in model.items()}}
    for key, value in asked.items():
        if found.get(key) != value:
            raise UserError(f"{out / 'results.json'} holds a finished run with {key} {found.get(key)!r}, "
                            f"not {value!r}; use another --out (or delete {out}) to train this configuration")


def _model_estimate(cfg: RunConfig) -> TransformerConfig:
    """The model with the BPE vocabulary it will get (the tokenizer decides the exact size)."""
    return cfg.model.with_vocabulary(cfg.data.vocab_size, cfg.model.pad_id)


def estimate_memory_gb(cfg: RunConfig) -> tuple[float, float]:
    """Rough training memory per device in GiB: (weights + gradients + Adam moments, activations).

    Activations: per token and layer, the residual-stream tensors (~10·d_model), the FFN (2·d_ff),
    the attention projections (3·h·(d_k + d_v)), and the attention weights (h · sequence length,
    taken as 256 tokens); the decoder has two attention blocks, and the pre-softmax logits are
    vocab_size per target token. Float32, one batch's tokens per side: `data.max_tokens` over the
    batches a step is split into (`step_batches`: devices x accumulation). The sinusoidal
    position table (model.max_len x d_model) counts with the weights.
    """
    m, tokens, seq = _model_estimate(cfg), cfg.data.max_tokens / step_batches(cfg.train), 256
    attention = 3 * m.n_heads * (m.d_k + m.d_v) + m.n_heads * seq
    per_layer = 10 * m.d_model + 2 * m.d_ff + attention
    activations = tokens * m.n_layers * (2 * per_layer + attention) + tokens * 2 * m.vocab_size
    table = 0 if m.positional == "learned" else 4 * m.max_len * m.d_model  # the sinusoid buffer
    return (16 * count_parameters(m) + table) / GB, 4 * activations / GB


def ram_gb() -> float:
    """This machine's RAM in GiB (a cgroup's limit where it is lower)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        ram = min(ram, int(limit)) if limit.isdigit() else ram
    except OSError:
        pass
    return ram / GB


def device_memory_gb(device: torch.device) -> tuple[float, str]:
    """The memory of `device` (a GPU's own, else this machine's RAM), and what it is."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device.index or 0).total_memory / GB, "the GPU's memory"
    return ram_gb(), "this machine's memory"


def machine_memory_gb(cfg: RunConfig) -> tuple[float, str]:
    """The memory one training process of `cfg` may use, and what it is: the smallest chosen GPU's
    memory, or on the CPU the machine's RAM (a cgroup's limit where it is lower), per process."""
    if uses_gpu(cfg):
        ids = parse_devices(cfg.train.devices)
        ids = ids if isinstance(ids, list) else range(torch.cuda.device_count())
        sizes = [torch.cuda.get_device_properties(i).total_memory for i in ids] or [0]
        return min(sizes) / GB, "the GPU's memory"
    devices = parse_devices(cfg.train.devices)
    processes = devices if isinstance(devices, int) else 1  # CPU DDP: one process a device
    return ram_gb() / processes, "this machine's memory" + (f" per process ({processes})" if processes > 1 else "")


def memory_limit_gb(cfg: RunConfig) -> tuple[float, str]:
    """The memory a run may plan for, and what it is: `train.max_memory_gb` when set, else the
    machine's or GPU's (`machine_memory_gb`). One limit for training and for the beam search."""
    if cfg.train.max_memory_gb is not None:
        return cfg.train.max_memory_gb, f"train.max_memory_gb={cfg.train.max_memory_gb:g}"
    limit, machine = machine_memory_gb(cfg)
    return limit, f"{machine} ({limit:.1f} GB)"


def check_memory(cfg: RunConfig) -> None:
    """Refuse, before any work, a configuration whose estimated training memory exceeds
    `train.max_memory_gb` or, when that is not set, the memory of the machine or GPU it would
    train on (`machine_memory_gb`): a model that cannot fit fails here in one line, not after
    minutes of data loading in a MemoryError."""
    limit, what = memory_limit_gb(cfg)
    states, activations = estimate_memory_gb(cfg)
    if states + activations > limit:
        raise UserError(
            f"estimated training memory {states + activations:.1f} GB exceeds {what} "
            f"(weights and Adam states {states:.1f} GB, activations ~{activations:.1f} GB at "
            f"data.max_tokens={cfg.data.max_tokens} over {step_batches(cfg.train)} batch(es) a step); lower "
            f"n_heads*d_k, d_ff, d_model, n_layers or data.max_tokens, or split each step into more batches "
            f"(train.accumulate_grad_batches; train.max_memory_gb sets another limit)")


def decoding_memory_gb(model: TransformerConfig, beam: int, batch_tokens: int, max_len_offset: int,
                       src_lengths: Sequence[int]) -> float:
    """Rough peak memory of beam search in GiB over the decoding batches of these source lengths
    (`evaluate.length_batches`: about `batch_tokens` source tokens a batch): per sentence and beam,
    the encoder output (width × d_model), the cross- and self-attention key/value caches of every
    decoder layer (width, and output length = width + offset up to max_len, × h·(d_k + d_v)) and
    three vocabulary-wide float32 rows (logits, log-probabilities, candidates); plus the weights."""
    from lightning_modules.evaluate import length_batches

    lengths = [min(n + 1, model.max_len) for n in src_lengths]  # + EOS, cut to max_len as translate does
    kv = model.n_heads * (model.d_k + model.d_v)
    peak = 0
    for batch in length_batches(lengths, batch_tokens):
        width = max(lengths[i] for i in batch)
        steps = min(width + max_len_offset, model.max_len)
        per_beam = width * model.d_model + model.n_layers * (width + steps) * kv + 3 * model.vocab_size
        peak = max(peak, len(batch) * beam * per_beam)
    return 4 * (peak + count_parameters(model)) / GB


def check_decoding_memory(model: TransformerConfig, cfg: RunConfig, src_lengths: Sequence[int]) -> None:
    """Refuse, before training, an evaluation whose beam search cannot fit (beam × length ×
    batch against `train.max_memory_gb`, else the machine's or GPU's memory): it would fail only
    after the whole training, in the final beam search."""
    e = cfg.eval
    need = decoding_memory_gb(model, e.beam_size, e.batch_tokens, e.max_len_offset, src_lengths)
    limit, what = memory_limit_gb(cfg)
    if need > limit:
        raise UserError(f"the final beam search would need ~{need:.1f} GB, more than {what} (beam "
                        f"{e.beam_size}, eval.batch_tokens={e.batch_tokens}, output up to source + "
                        f"{e.max_len_offset} tokens); lower eval.beam_size, eval.batch_tokens or "
                        f"eval.max_len_offset")


def checkpoint_bytes(cfg: RunConfig) -> int:
    """The disk a run's checkpoints need: three of weights and Adam's two moments (float32), and
    room for the logs."""
    return 3 * 12 * count_parameters(_model_estimate(cfg)) + 64 * 2 ** 20


def check_disk_space(out: Path, cfg: RunConfig) -> None:
    """Fail before training if the disk cannot hold the checkpoints (`checkpoint_bytes`)."""
    need = checkpoint_bytes(cfg)
    free = shutil.disk_usage(out).free
    if free < need:
        raise UserError(f"{out}: {free / GB:.2f} GB free, but this model's checkpoints need about "
                        f"{need / GB:.2f} GB; free some space or use another --out")


def _api_key() -> str | None:
    if key := os.environ.get("WANDB_API_KEY"):
        return key
    try:
        auth = netrc.netrc().authenticators("api.wandb.ai")
    except (OSError, netrc.NetrcParseError):
        return None
    return auth[2] if auth else None


def _api_key_problem(key: str | None) -> str | None:
    if not key:
        return "no API key (set WANDB_API_KEY or run `wandb login`)"
    try:
        from wandb.sdk.lib.wbauth.validation import check_api_key
    except ImportError:  # another wandb version: let wandb itself judge the key
        return None
    problem = check_api_key(key)
    return f"the API key is malformed ({problem.rstrip('.')})" if problem else None


def wandb_mode(setting: str, on_error: str = "fail") -> str | None:
    """'online', 'offline' or None (off). 'auto' is online only with a well-formed API key.

    'online' without a usable key fails with one line, or falls back to offline when
    `on_error` is "offline" (train.wandb_on_error). The key itself is never printed.
    """
    if setting == "off" or os.environ.get("WANDB_MODE") == "disabled":
        return None
    if setting == "offline":
        return setting
    problem = _api_key_problem(_api_key())
    if setting == "auto":
        return "offline" if problem else "online"
    if problem is None:
        return "online"
    if on_error == "offline":
        from lightning.pytorch.utilities import rank_zero_warn

        rank_zero_warn(f"W&B online: {problem}; logging offline instead (train.wandb_on_error=offline)")
        return "offline"
    raise UserError(f"--wandb online: {problem}; or set train.wandb_on_error=offline to log offline")


def resume_checkpoint(ckpt_dir: Path, model: TransformerConfig | None = None,
                      damaged: list[tuple[Path, str]] | None = None) -> tuple[Path, int] | None:
    """The checkpoint to resume from and its step: the valid one with the highest step (newest on
    a tie).

    A damaged file (a zip whose CRCs fail, e.g. copied in half) is renamed to `*.corrupt` with a
    warning and skipped; a checkpoint saved by another model than `model` (when given) is
    refused with one line. A file gone by the time it is read is skipped without a word: the
    table's archive reads live run directories, where Lightning removes the older step checkpoint
    as it saves the next (Lightning writes each checkpoint atomically, so a live one is never
    half-written). `damaged`: a list that collects (path, why) for the damaged files instead,
    changing nothing (the commands that only read a run: `run.use`).
    """

    def aside(path: Path, why: str) -> None:
        if damaged is None:
            set_aside(path, why)
        else:
            damaged.append((path, why))

    if not ckpt_dir.is_dir():
        return None
    wanted, best, best_key = asdict(model) if model else {}, None, None
    for path in sorted(ckpt_dir.glob("*.ckpt")):
        try:
            with zipfile.ZipFile(path) as archive:
                broken = archive.testzip() is not None
        except FileNotFoundError:
            continue  # removed since the listing
        except (zipfile.BadZipFile, OSError):
            broken = True
        if broken:
            aside(path, "its zip data fails its CRC check")
            continue
        try:
            saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            continue  # removed since the listing
        except Exception:  # noqa: BLE001 (an unpickling refusal under weights_only, a foreign zip)
            aside(path, "not a checkpoint this harness writes: it does not load with weights_only")
            continue
        if not isinstance(saved, dict):
            aside(path, "not a checkpoint this harness writes")
            continue
        hyper = saved.get("hyper_parameters")
        old = hyper.get("model", {}) if isinstance(hyper, dict) else {}
        old = old if isinstance(old, dict) else {}
        for key, value in wanted.items():
            if key in old and old[key] != value:
                raise UserError(f"{path} was saved by another model ({key}={old[key]!r}, not {value!r}); "
                                f"use another --out, or move the checkpoint away")
        key = (int(saved.get("global_step", 0)), mtime)
        if best_key is None or key > best_key:
            best, best_key = path, key
    return None if best is None or best_key is None else (best, best_key[0])
