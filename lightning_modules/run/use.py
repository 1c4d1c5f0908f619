"""Using a finished (or checkpointed) run: load its model once (the checkpoint `--checkpoint` picks:
last, best or average:K), translate, evaluate (docs/using-models.md)."""

from __future__ import annotations

import math
import pickle
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, TextIO

import torch

from lightning_modules.config import DataConfig, EvalConfig, TransformerConfig
from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, load
from foundation.errors import UserError
from lightning_modules.evaluate import corpus_bleu, length_batches, translate
from foundation.io import atomic_write_json, check_readable_file, check_writable_file, write_lines
from lightning_modules.run.environment import native_bf16
from lightning_modules.run.preflight import resume_checkpoint
from lightning_modules.run.results import read_results
from foundation.rundir import CONFIG, saved_config
from lightning_modules.transformer import Transformer

_AVERAGE = re.compile(r"average:([0-9]+)")


def _known(cls: type, values: dict[str, Any]) -> Any:
    """A config dataclass from a saved section, ignoring keys this version does not have."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in (values or {}).items() if k in names})


def read_run_config(run_dir: Path) -> dict[str, Any]:
    """The run's config.yaml as saved (one line if it is missing or not YAML)."""
    path = run_dir / CONFIG
    if not path.is_file():
        raise UserError(f"{run_dir} is not a run directory (no {CONFIG})")
    saved = saved_config(run_dir)
    if saved is None:
        raise UserError(f"{path} is not a run's configuration (not a YAML mapping)")
    return saved


def pick_device(name: str | None) -> torch.device:
    """`--device`: cpu, cuda, cuda:N or mps (default: the first GPU if there is one, else cpu)."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise UserError(f"--device must be cpu, cuda, cuda:N or mps; got {name!r}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise UserError(f"--device {name}: no CUDA GPU is visible on this machine")
        if (device.index or 0) >= count:
            raise UserError(f"--device {name}: no such GPU here ({count} visible: ids 0 to {count - 1})")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {name}: this machine has no MPS device")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise UserError(f"--device must be cpu, cuda, cuda:N or mps; got {name!r}")
    return device


def _step_checkpoints(ckpt_dir: Path) -> dict[int, Path]:
    """One readable checkpoint per step (the newest file of a step), by step."""
    by_step: dict[int, tuple[float, Path]] = {}
    for path in ckpt_dir.glob("*.ckpt"):
        try:
            step = int(torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("global_step", 0))
            mtime = path.stat().st_mtime
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError):
            continue  # damaged or gone: `resume_checkpoint` sets damaged ones aside
        if step not in by_step or mtime > by_step[step][0]:
            by_step[step] = (mtime, path)
    return {step: path for step, (_, path) in by_step.items()}


def _best_step(run_dir: Path, steps: Iterable[int]) -> int:
    """The step among `steps` with the lowest dev perplexity logged at it."""
    from lightning_modules.metrics_log import logged

    ppl = logged(run_dir / "logs", "val/ppl")
    scored = [(ppl[s], s) for s in steps if s in ppl]
    if not scored:
        raise UserError(f"--checkpoint best: no checkpoint in {run_dir / 'checkpoints'} is at a step with a "
                        f"logged dev perplexity (set train.checkpoint_every to a multiple of "
                        f"train.val_check_interval); use last or average:K")
    return min(scored)[1]


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of each tensor over `states` (summed in float64, kept in its dtype)."""
    keys = states[0].keys()
    for other in states[1:]:
        if other.keys() != keys:
            raise UserError("the checkpoints to average hold different parameters")
        for k in keys:
            if other[k].shape != states[0][k].shape:
                raise UserError(f"the checkpoints to average hold {k} of different shapes "
                                f"({tuple(states[0][k].shape)} and {tuple(other[k].shape)})")
    return {k: (sum(s[k].double() for s in states) / len(states)).to(states[0][k].dtype)
            if states[0][k].is_floating_point() else states[0][k] for k in keys}


@dataclass
class Weights:
    model: TransformerConfig
    state: dict[str, torch.Tensor]
    description: str  # e.g. "last (step 10)" or "average of 3 (steps 6, 8, 10)"
    steps: list[int]


def checkpoint_choice(choice: str) -> int | None:
    """`--checkpoint`, checked before anything is loaded: None for last or best, K for average:K."""
    average = _AVERAGE.fullmatch(choice) if isinstance(choice, str) else None
    if choice in ("last", "best"):
        return None
    if average is None:
        raise UserError(f"--checkpoint must be last, best or average:K (K a whole number >= 1); got {str(choice)[:80]!r}")
    k = int(average.group(1))
    if k < 1:
        raise UserError("--checkpoint average:K needs K >= 1")
    return k


def _newest_intact(ckpt_dir: Path, run_dir: Path) -> tuple[Path, int]:
    """The newest checkpoint that loads (damaged ones skipped with a warning, never set aside)."""
    damaged: list[tuple[Path, str]] = []
    found = resume_checkpoint(ckpt_dir, damaged=damaged)
    if found is None and damaged:
        path, why = damaged[0]
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise UserError(f"{path} is not a checkpoint this harness writes ({why}){more}; {run_dir} has no "
                        f"other checkpoint")
    if found is None:
        raise UserError(f"{run_dir} has no checkpoint (nothing in {ckpt_dir})")
    for path, why in damaged:
        print(f"ablate: warning: {path} skipped ({why})", file=sys.stderr, flush=True)
    return found


def _checkpoint_model(checkpoint: Any, path: Path) -> dict[str, Any]:
    """The saved model section of a checkpoint of ours (one line if it has none)."""
    model = checkpoint.get("hyper_parameters", {}).get("model") if isinstance(checkpoint, dict) else None
    if not isinstance(model, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise UserError(f"{path} is not a checkpoint of one of our runs (it holds no hyper_parameters.model "
                        f"and state_dict)")
    return model


def load_weights(run_dir: Path, choice: str = "last") -> Weights:
    """The model config and parameters that `choice` (last | best | average:K) names."""
    ckpt_dir = run_dir / "checkpoints"
    k = checkpoint_choice(choice)
    found = _newest_intact(ckpt_dir, run_dir)
    if choice == "last":
        paths, steps = [found[0]], [found[1]]
    else:
        by_step = _step_checkpoints(ckpt_dir)
        if choice == "best":
            steps = [_best_step(run_dir, by_step)]
        else:
            assert k is not None
            if len(by_step) < k:
                raise UserError(f"--checkpoint {choice}: {ckpt_dir} keeps {len(by_step)} checkpoint(s) "
                                f"(steps {', '.join(map(str, sorted(by_step)))}); train with "
                                f"train.keep_checkpoints={k} (or more) to average {k}")
            steps = sorted(by_step)[-k:]
        paths = [by_step[s] for s in steps]
    checkpoints = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    saved = [_checkpoint_model(c, p) for c, p in zip(checkpoints, paths)]
    for other, step in zip(saved[1:], steps[1:]):
        if other != saved[0]:
            changed = sorted(key for key in {*other, *saved[0]} if other.get(key) != saved[0].get(key))
            raise UserError(f"--checkpoint {choice}: the checkpoints of steps {steps[0]} and {step} hold different "
                            f"models ({', '.join(changed[:3])}); they cannot be averaged (another model's "
                            f"checkpoint in {ckpt_dir}?)")
    try:
        model = _known(TransformerConfig, saved[0])
    except (TypeError, ValueError) as err:
        raise UserError(f"{paths[0]}: its saved model is not one this version builds ({err})") from None
    states = [{k.removeprefix("model."): v for k, v in c["state_dict"].items() if k.startswith("model.")}
              for c in checkpoints]  # the Transformer's parameters and buffers in a TranslationModule's state
    state = states[0] if len(states) == 1 else average_state_dicts(states)
    description = f"{choice} (step {steps[0]})" if k is None else \
        f"average of {len(steps)} (steps {', '.join(map(str, steps))})"
    return Weights(model, state, description, steps)


@dataclass
class LoadedRun:
    """A run's model (in eval mode, on its device), tokenizer and saved settings."""

    run_dir: Path
    config: dict[str, Any]  # config.yaml as saved
    model: Transformer
    tokenizer: Any  # sentencepiece.SentencePieceProcessor
    device: torch.device
    weights: str  # which checkpoint(s)
    steps: list[int]
    # decode under bf16 autocast, as the run's own evaluation did, where this device computes bf16
    # natively (a GPU; a CPU with a flag of environment.NATIVE_BF16); elsewhere fp32
    bf16: bool

    @property
    def eval_config(self) -> EvalConfig:
        return _known(EvalConfig, self.config.get("eval"))

    @property
    def max_len(self) -> int:
        return self.model.config.max_len

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode(list(texts))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([i for i in ids if i not in (PAD_ID, BOS_ID, EOS_ID)])

    def pieces(self, ids: list[int]) -> list[str]:
        return [self.tokenizer.id_to_piece(i) for i in ids]

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16) if self.bf16 else nullcontext()


def load_run(run_dir: str | Path, checkpoint: str = "last", device: str | None = None) -> LoadedRun:
    """Load a run's model once: its checkpoint(s), its tokenizer, on `device`."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a directory")
    where = pick_device(device)
    config = read_run_config(run_dir)
    if not (run_dir / "spm.model").is_file():
        raise UserError(f"{run_dir} has no spm.model (the run's tokenizer)")
    tokenizer = _tokenizer(run_dir / "spm.model")
    weights = load_weights(run_dir, checkpoint)
    try:
        model = Transformer(weights.model)
        model.load_state_dict(weights.state)
    except (RuntimeError, ValueError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{run_dir}: the weights of {weights.description} do not fit the model its checkpoint "
                        f"describes ({first[:200]})") from None
    model.to(where).eval()
    precision = _saved_precision(run_dir)
    bf16 = precision.startswith("bf16") and (where.type == "cuda" or where.type == "cpu" and native_bf16())
    return LoadedRun(run_dir, config, model, tokenizer, where, weights.description, weights.steps, bf16)


def _tokenizer(path: Path) -> Any:
    """The run's sentencepiece model; a damaged one is one line (a reading command changes nothing)."""
    try:
        return load(path)
    except (RuntimeError, OSError, ValueError) as err:
        raise UserError(f"{path} is damaged: sentencepiece cannot load it ({str(err).strip()[:120]}); "
                        f"`ablate train` with this run's --out sets it aside and trains the same BPE again") from None


def _saved_precision(run_dir: Path) -> str:
    """The precision the run trained (and decoded) in, from results.json or its config."""
    done = read_results(run_dir)
    if done is not None:
        return str(done.precision or "")
    return str((read_run_config(run_dir).get("train") or {}).get("precision") or "")


def decoding(run: LoadedRun, beam: int | None = None, alpha: float | None = None,
             max_len_offset: int | None = None, batch_tokens: int | None = None,
             cuda_graphs: bool | None = None) -> EvalConfig:
    """The run's decoding settings with the given ones in their place (validated)."""
    chosen = {"beam_size": beam, "length_penalty": alpha, "max_len_offset": max_len_offset,
              "batch_tokens": batch_tokens, "cuda_graphs": cuda_graphs}
    cfg = replace(run.eval_config, **{k: v for k, v in chosen.items() if v is not None})
    check_beam_memory(run, cfg)
    return cfg


def check_beam_memory(run: LoadedRun, cfg: EvalConfig) -> None:
    """Refuse, before any sentence is read, a beam search the device's memory cannot hold."""
    from lightning_modules.config import count_parameters
    from lightning_modules.run.preflight import GB, decoding_memory_gb, device_memory_gb

    model = run.model.config
    # one max_len-long sentence, scaled to the batch's count (the estimate is linear in it)
    one = decoding_memory_gb(model, cfg.beam_size, model.max_len, cfg.max_len_offset, [model.max_len - 1])
    weights = 4 * count_parameters(model) / GB
    need = weights + (one - weights) * max(1, cfg.batch_tokens // model.max_len)
    limit, what = device_memory_gb(run.device)
    if need > limit:
        raise UserError(f"beam search with --beam {cfg.beam_size} would need ~{need:.1f} GB, more than "
                        f"{what} ({limit:.1f} GB; --batch-tokens {cfg.batch_tokens}, output up to source + "
                        f"{cfg.max_len_offset}); lower --beam or --batch-tokens")


def check_known(run: LoadedRun, ids: list[int], where: str) -> None:
    """One line if `ids` hold no piece the vocabulary knows (a bare word boundary "▁" aside)."""
    if ids and all(i == UNK_ID or run.tokenizer.id_to_piece(i) == "\u2581" for i in ids):
        raise UserError(f"{where} has only pieces unknown to the run's vocabulary; nothing to translate")


def translate_lines(run: LoadedRun, lines: list[str], cfg: EvalConfig, first_line: int = 1,
                    warn: TextIO | None = sys.stderr) -> list[str]:
    """Detokenized translations of `lines` in order (an over-long line cut to max_len, with a warning)."""
    ids = run.encode(lines)
    limit = run.max_len - 1  # room for EOS
    todo = []
    for n, (line, piece_ids) in enumerate(zip(lines, ids), start=first_line):
        if not line.strip():
            continue
        check_known(run, piece_ids, f"line {n}")
        if len(piece_ids) > limit and warn is not None:
            print(f"ablate: warning: line {n} has {len(piece_ids)} wordpieces; the model takes at most "
                  f"{limit}: translating the first {limit}", file=warn, flush=True)
        todo.append(n - first_line)
    out = [""] * len(lines)
    with run.autocast():
        hyps = translate(run.model, [ids[i] for i in todo], BOS_ID, EOS_ID, cfg)
    for i, hyp in zip(todo, hyps):
        out[i] = run.decode(hyp)
    return out


def text_lines(stream: Iterable[str | bytes], where: str = "the input") -> Iterator[str]:
    """The lines of `stream` as text, bytes decoded one line at a time, so a line that is not UTF-8 or
    holds a NUL byte is one line naming it, after the lines before it are answered."""
    for n, raw in enumerate(stream, start=1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise UserError(f"{where}: line {n} is not UTF-8 text (byte {err.start + 1}); give UTF-8, "
                                f"one sentence a line") from None
        if "\0" in raw or any("\ud800" <= ch <= "\udfff" for ch in raw):
            what = "a NUL byte" if "\0" in raw else "bytes that are not UTF-8"
            raise UserError(f"{where}: line {n} holds {what}; give UTF-8 text, one sentence a line")
        yield raw


def chunks(stream: Iterable[str | bytes], batch_tokens: int, interactive: bool) -> Iterator[list[str]]:
    """Input lines in groups of about `batch_tokens` words + EOS (from a terminal, one at a time)."""
    group: list[str] = []
    words = 0
    for raw in text_lines(stream):
        line = raw.rstrip("\n").rstrip("\r")
        group.append(line)
        words += len(line.split()) + 1
        if interactive or words >= batch_tokens:
            yield group
            group, words = [], 0
    if group:
        yield group


def translate_stream(run: LoadedRun, stream: Iterable[str | bytes], out: TextIO, cfg: EvalConfig,
                     interactive: bool = False) -> int:
    """Translate `stream` line by line onto `out`, flushed after each group; the lines read."""
    done = 0
    for group in chunks(stream, cfg.batch_tokens, interactive):
        for line in translate_lines(run, group, cfg, first_line=done + 1):
            out.write(line + "\n")
        out.flush()
        done += len(group)
    return done


@torch.no_grad()
def perplexity(run: LoadedRun, sources: list[str], references: list[str], batch_tokens: int
               ) -> tuple[float, int, int]:
    """Per-wordpiece perplexity of the references as the run's dev PPL; (ppl, pairs, target tokens)."""
    from lightning_modules.data.batching import collate
    from lightning_modules.loss import label_smoothed_nll

    src, tgt = run.encode(sources), run.encode(references)
    limit = run.max_len - 1
    keep = [i for i in range(len(src)) if len(src[i]) <= limit and len(tgt[i]) <= limit]
    total_nll, total_tokens = 0.0, 0
    for batch in length_batches([len(src[i]) + len(tgt[i]) for i in keep], batch_tokens):
        b = collate([(src[keep[j]], tgt[keep[j]]) for j in batch], pad_id=run.model.config.pad_id)
        with run.autocast():
            logits = run.model(b["src"].to(run.device), b["tgt_in"].to(run.device))
        _, nll, n = label_smoothed_nll(logits, b["tgt_out"].to(run.device), run.model.config.pad_id, 0.0)
        total_nll += float(nll)
        total_tokens += int(n)
    if not total_tokens:
        raise UserError(f"no sentence pair fits the model's max_len ({run.max_len}); nothing to score")
    return math.exp(min(total_nll / total_tokens, 50.0)), len(keep), total_tokens


def attention_dir(run_dir: Path, sentence: str | None, line: int | None, checkpoint: str) -> Path:
    """`ablate attention`'s default folder in the run: `attention-{line-N|sentence-HASH}-CHECKPOINT`."""
    import hashlib

    what = f"line-{line}" if sentence is None else \
        f"sentence-{hashlib.sha1(sentence.encode('utf-8', 'surrogatepass')).hexdigest()[:10]}"
    return run_dir / f"attention-{what}-{checkpoint.replace(':', '')}"


def settings_name(split: str, checkpoint: str, cfg: EvalConfig) -> str:
    """`evaluate-<split>-<checkpoint>-beamB-aALPHA-lenOFFSET` (a file-name stem)."""
    ckpt = checkpoint.replace(":", "")
    return (f"evaluate-{split}-{ckpt}-beam{cfg.beam_size}-a{cfg.length_penalty:g}-len{cfg.max_len_offset}")


def evaluate(run: LoadedRun, name: str, sources: list[str], references: list[str], cfg: EvalConfig,
             checkpoint: str, source_label: str) -> tuple[dict[str, Any], Path]:
    """Translate and score, then save `<stem>.json`, `.hyp.txt` and `.ref.txt`; (numbers, JSON path)."""
    if len(sources) != len(references):
        raise UserError(f"{source_label}: {len(sources)} source lines but {len(references)} references")
    if not sources:
        raise UserError(f"{source_label}: no sentences to evaluate")
    stem = settings_name(name, checkpoint, cfg)
    target = run.run_dir / f"{stem}.json"
    check_writable_file(target, "the evaluation")
    with run.autocast():  # the run's own evaluation, exactly: every line, in one call
        hyps = [run.decode(ids) for ids in translate(run.model, run.encode(sources), BOS_ID, EOS_ID, cfg)]
    bleu, signature = corpus_bleu(hyps, references, cfg.bleu_tokenize)
    ppl, pairs, tokens = perplexity(run, sources, references, cfg.batch_tokens)
    numbers = {
        "bleu": bleu, "sacrebleu_signature": signature, "ppl": round(ppl, 3),
        "sentences": len(sources), "ppl_pairs": pairs, "ppl_target_tokens": tokens,
        "data": source_label,
        "settings": {"checkpoint": checkpoint, "weights": run.weights, "steps": run.steps,
                     "beam_size": cfg.beam_size, "length_penalty": cfg.length_penalty,
                     "max_len_offset": cfg.max_len_offset, "batch_tokens": cfg.batch_tokens,
                     "bleu_tokenize": cfg.bleu_tokenize, "cuda_graphs": cfg.cuda_graphs, "device": str(run.device),
                     "bf16_autocast": run.bf16},
        "hypotheses": f"{stem}.hyp.txt", "references": f"{stem}.ref.txt",
    }
    write_lines(run.run_dir / f"{stem}.hyp.txt", hyps)
    write_lines(run.run_dir / f"{stem}.ref.txt", references)
    atomic_write_json(target, numbers)
    return numbers, target


def split_texts(data: DataConfig, split: str) -> tuple[list[str], list[str]]:
    """Sources and references of a corpus split ('valid' or 'test'), as the run's training read them."""
    from lightning_modules.data.corpora import load_corpus

    text = getattr(load_corpus(data), split)
    if not len(text):
        raise UserError(f"corpus {data.corpus} has no {split} sentences")
    return list(text.src), list(text.tgt)


def open_input(path: str | None) -> tuple[Iterable[str | bytes], bool]:
    """The lines to translate (`path`, else stdin) as bytes, and whether they come from a terminal."""
    if path is not None:
        check_readable_file(path, "--input file")
        return open(path, "rb"), False
    stdin = sys.stdin
    try:
        if stdin is None or stdin.closed:
            raise OSError
        import os

        os.fstat(stdin.fileno())
    except (OSError, ValueError, AttributeError):
        raise UserError("stdin is closed; pipe sentences in, one a line, or give --input FILE") from None
    return getattr(stdin, "buffer", stdin), stdin.isatty()


def evaluation_texts(run_config: dict[str, Any], split: str | None, src: str | None, ref: str | None,
                     corpus: str | None, data_dir: str | None, base_url: str | None
                     ) -> tuple[str, list[str], list[str], str]:
    """What `ablate evaluate` scores: (name for the files, sources, references, a label)."""
    from lightning_modules.data.corpora import read_lines

    if src or ref:
        if not (src and ref):
            raise UserError("give both --src FILE and --ref FILE (or --split)")
        if split or corpus:
            raise UserError("--src/--ref score your own files: leave out --split and --data")
        for path in (src, ref):
            if not Path(path).is_file():
                raise UserError(f"{path}: no such file")
        name = re.sub(r"[^\w.-]+", "_", Path(src).name)
        return f"file-{name}", read_lines(src), read_lines(ref), f"{src} -> {ref}"
    split = split or "valid"
    data = _known(DataConfig, run_config.get("data"))
    if corpus == "files":
        raise UserError("--data files: give the files as --src FILE --ref FILE")
    name = split if not corpus or corpus == data.corpus else f"{split}-{corpus}"
    changes = {k: v for k, v in (("corpus", corpus), ("data_dir", data_dir), ("base_url", base_url)) if v}
    data = replace(data, **changes)
    sources, references = split_texts(data, split)
    return name, sources, references, f"{data.corpus} {split}"
