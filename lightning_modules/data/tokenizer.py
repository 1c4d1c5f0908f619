"""A shared source/target BPE vocabulary (sentencepiece), trained once per corpus and settings
(kept in the preparation cache) and saved in each run directory."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from lightning_modules.data import cache
from foundation.errors import UserError
from foundation.io import atomic_write_bytes, set_aside

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_TOO_LARGE = re.compile(r"[Vv]ocabulary size (?:is )?too high \((\d+)\).*?<=\s*(\d+)", re.S)
_TOO_SMALL = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def load(model_path: str | Path) -> spm.SentencePieceProcessor:
    """Load a trained model, checking that its special ids are the ones this project uses."""
    processor = spm.SentencePieceProcessor(model_file=str(model_path))
    ids = (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id())
    if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
        raise UserError(f"{model_path} has special ids pad/unk/bos/eos={ids}, expected "
                        f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; delete it to retrain")
    return processor


def train_or_load(model_path: Path, texts: Iterable[str], vocab_size: int,
                  input_sentence_size: int, seed: int = 0, cached: Path | None = None
                  ) -> tuple[spm.SentencePieceProcessor, str]:
    """The model at `model_path`, else `cached`'s, else one trained on `texts`; and where it came from."""
    model_path = Path(model_path)
    if model_path.is_file():
        try:
            return load(model_path), "run directory"
        except (OSError, RuntimeError) as err:  # not a sentencepiece model: set aside, trained anew
            set_aside(model_path, f"not a sentencepiece model: {str(err).splitlines()[0][:120]}")
            if model_path.with_suffix(".vocab").is_file():
                set_aside(model_path.with_suffix(".vocab"), "the vocabulary of a damaged spm.model")
    model_path.parent.mkdir(parents=True, exist_ok=True)
    if cached is not None and _from_cache(cached, model_path):
        return load(model_path), "cache"
    spm.set_random_generator_seed(seed)
    with tempfile.TemporaryDirectory(dir=model_path.parent, prefix=".spm-") as tmp:
        prefix = Path(tmp) / "spm"
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=(text for text in texts if text),
                model_prefix=str(prefix),
                model_type="bpe",
                vocab_size=vocab_size,
                character_coverage=1.0,
                input_sentence_size=max(input_sentence_size, 101),  # spm rejects 1..100
                shuffle_input_sentence=True,
                pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                num_threads=os.cpu_count() or 1,
                minloglevel=2,  # errors only: no per-iteration log spam
            )
        except RuntimeError as err:
            match = _TOO_LARGE.search(str(err))
            if match:
                raise UserError(f"data.vocab_size={vocab_size} is too large for this corpus: "
                                f"sentencepiece allows at most {match.group(2)}") from None
            match = _TOO_SMALL.search(str(err))
            if match or "insert_id(" in str(err):  # below the 4 special pieces spm names no size
                need = f"at least {int(match.group(2)) + 4:,}" if match else "more than 4"
                raise UserError(f"data.vocab_size={vocab_size} is too small for this corpus: sentencepiece "
                                f"needs {need} pieces (one per character it covers, and pad, unk, bos and "
                                f"eos)") from None
            if "sentences_.empty()" in str(err):
                raise UserError("sentencepiece found no sentence to train the BPE on: every training line "
                                "is empty or longer than its limit of 4,192 bytes") from None
            raise UserError(f"sentencepiece training failed: {err}") from err
        os.replace(f"{prefix}.vocab", model_path.with_suffix(".vocab"))
        os.replace(f"{prefix}.model", model_path)
    if cached is not None:  # the .vocab first: a .model entry is only ever beside its .vocab
        if cache.store(cached.with_suffix(".vocab"), model_path.with_suffix(".vocab").read_bytes()):
            cache.store(cached, model_path.read_bytes())
    return load(model_path), "trained"


def _from_cache(cached: Path, model_path: Path) -> bool:
    """Copy the cache entry `cached` (.vocab, then .model) to `model_path`; False: no model of ours."""
    try:
        load(cached)
        model, vocab = cached.read_bytes(), cached.with_suffix(".vocab").read_bytes()
    except (OSError, RuntimeError, UserError):
        return False
    atomic_write_bytes(model_path.with_suffix(".vocab"), vocab)
    atomic_write_bytes(model_path, model)
    return True
