"""A corpus made ready for a run, without Lightning (the command that queues a table prepares it and
loads none): read, its BPE trained or reused, every split encoded and length-filtered, its statistics."""

from __future__ import annotations

import itertools
import os
import sys
import time
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sentencepiece as spm
from torch.utils.data import Dataset

from lightning_modules.config import DataConfig
from lightning_modules.data import cache, tokenizer
from lightning_modules.data.batching import (ShapeBuckets, TokenBucketBatchSampler, batch_shapes,
                                             padding_share)
from lightning_modules.data.corpora import Corpus, ParallelText, load_corpus
from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, train_or_load
from foundation.errors import UserError
from lightning_modules.stopwatch import Stages


def unigram_perplexity(target_ids: np.ndarray, sentences: int, vocab_size: int) -> float:
    """exp(H) of the unigram distribution of `target_ids` plus one EOS per sentence."""
    counts = np.bincount(target_ids, minlength=vocab_size).astype(np.float64)
    counts[EOS_ID] += sentences
    p = counts[counts > 0] / counts.sum()
    return float(np.exp(-(p * np.log(p)).sum()))


ENCODE_CHUNK = 50_000  # sentences encoded at a time: as Python lists their ids take ~36 bytes each
BPE_SEED = 0  # sentencepiece's sampling of the training sentences: one BPE model per corpus and settings
ARRAYS = ("src_lengths", "src_ids", "tgt_lengths", "tgt_ids")  # an encoded split as the cache keeps it


class EncodedPairs(Dataset):
    """Token-id pairs stored as flat int32 arrays plus offsets (compact for millions of pairs)."""

    def __init__(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> None:
        self._set(*self._pack(src), *self._pack(tgt))

    @classmethod
    def from_arrays(cls, src_lengths: np.ndarray, src_ids: np.ndarray, tgt_lengths: np.ndarray,
                    tgt_ids: np.ndarray) -> EncodedPairs:
        """From each side's lengths and its ids concatenated (int32)."""
        pairs = cls.__new__(cls)
        pairs._set(src_lengths, src_ids, tgt_lengths, tgt_ids)
        return pairs

    def _set(self, src_lengths: np.ndarray, src_ids: np.ndarray, tgt_lengths: np.ndarray,
             tgt_ids: np.ndarray) -> None:
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError(f"{len(src_lengths)} sources but {len(tgt_lengths)} targets")
        self.src_lengths, self._src_offsets, self._src = src_lengths, _offsets(src_lengths), src_ids
        self.tgt_lengths, self._tgt_offsets, self._tgt = tgt_lengths, _offsets(tgt_lengths), tgt_ids

    @staticmethod
    def _pack(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(lengths.sum()))
        return lengths, flat

    def arrays(self) -> dict[str, np.ndarray]:
        """Each side's lengths and its ids concatenated (`from_arrays`' arguments, by `ARRAYS` name)."""
        return dict(zip(ARRAYS, (self.src_lengths, self._src, self.tgt_lengths, self._tgt)))

    def select(self, keep: np.ndarray) -> EncodedPairs:
        """The pairs where the boolean mask `keep` is set, in order."""
        return EncodedPairs.from_arrays(self.src_lengths[keep], self._src[np.repeat(keep, self.src_lengths)],
                                        self.tgt_lengths[keep], self._tgt[np.repeat(keep, self.tgt_lengths)])

    def __len__(self) -> int:
        return len(self.src_lengths)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        src = self._src[self._src_offsets[i]:self._src_offsets[i + 1]].tolist()
        tgt = self._tgt[self._tgt_offsets[i]:self._tgt_offsets[i + 1]].tolist()
        return src, tgt


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """Where each sequence starts in the flat array, and the end: [0, l0, l0 + l1, ...]."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def read_encoded(path: Path, pairs: int, vocab_size: int) -> EncodedPairs | None:
    """An encoded split from the cache; None if absent, unreadable or not `pairs` pairs of valid ids."""
    try:
        with np.load(path, allow_pickle=False) as entry:
            arrays = [entry[name] for name in ARRAYS]
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # absent, cut short, not an .npz of ours
        return None
    for lengths, ids in (arrays[:2], arrays[2:]):
        if (lengths.dtype != np.int64 or ids.dtype != np.int32 or lengths.shape != (pairs,) or ids.ndim != 1
                or int(lengths.sum()) != len(ids) or (len(lengths) and lengths.min() < 0)
                or (len(ids) and not 0 <= ids.min() <= ids.max() < vocab_size)):
            return None
    return EncodedPairs.from_arrays(*arrays)


def concatenate(parts: Sequence[EncodedPairs]) -> EncodedPairs:
    """The pairs of every part, one part after the other."""
    return EncodedPairs.from_arrays(np.concatenate([p.src_lengths for p in parts]),
                                    np.concatenate([p._src for p in parts]),
                                    np.concatenate([p.tgt_lengths for p in parts]),
                                    np.concatenate([p._tgt for p in parts]))


class TranslationData:
    """Loads `cfg.corpus`, trains or reuses its BPE and encodes every split, dropping pairs too long."""

    def __init__(self, cfg: DataConfig, run_dir: str | Path, seed: int = 1,
                 max_len: int = 512, pad_multiple: int = 1) -> None:
        super().__init__()  # cooperative: TranslationDataModule's next base is Lightning's
        self.cfg = cfg
        self.pad_multiple = max(1, pad_multiple)
        self.run_dir = Path(run_dir)
        self.seed = seed
        self.max_len = max_len
        self.pad_id = PAD_ID
        self.stats: dict[str, Any] = {}
        # the batches one optimizer step is split into (devices x accumulation, `split_steps`)
        self.micro_batches = 1
        self.train_sampler: TokenBucketBatchSampler | None = None
        self.buckets: ShapeBuckets | None = None
        self._corpus: Corpus | None = None
        self._ready = False
        self.stages = Stages()  # wall, CPU and peak memory of each preparation step (stats["stages"])
        self._digests: dict[int, bytes] = {}  # id(split) -> its text's digest (`_digest`)
        self.bpe_origin = ""  # where spm.model came from: run directory, cache or trained
        self.from_cache: list[str] = []  # the encoded splits read from the cache (stats["prepared"])

    @property
    def spm_path(self) -> Path:
        return self.run_dir / "spm.model"

    def _load(self) -> Corpus:
        if self._corpus is None:
            self._corpus = load_corpus(self.cfg, self.stages)
        return self._corpus

    def _bpe_texts(self, corpus: Corpus) -> Iterator[str]:
        parts = [corpus.train]
        if corpus.extra_train is not None:
            parts.append(corpus.extra_train)
        for part in parts:
            yield from part.src
            yield from part.tgt

    def _digest(self, split: ParallelText) -> bytes:
        """A digest of a split's text (both sides), computed once per split: the cache's keys."""
        if id(split) not in self._digests:
            self._digests[id(split)] = cache.texts_digest(split.src) + cache.texts_digest(split.tgt)
        return self._digests[id(split)]

    def corpus_digest(self) -> str:
        """A digest of the corpus's text as this run reads it (every split, both sides)."""
        corpus = self._load()
        parts = (corpus.train, corpus.extra_train, corpus.valid, corpus.test)
        return cache.key("corpus", *(self._digest(part) if part is not None else b"" for part in parts))

    def _bpe_entry(self, corpus: Corpus) -> Path:
        """The cache entry of the BPE model these training texts and settings train."""
        parts = [corpus.train] + ([corpus.extra_train] if corpus.extra_train is not None else [])
        name = cache.key("bpe", *(self._digest(part) for part in parts), self.cfg.vocab_size,
                         self.cfg.spm_input_sentence_size, BPE_SEED, spm.__version__, cache.source(tokenizer))
        return cache.entry(self.cfg.cache_dir, "bpe", f"{name}.model")

    def _tokenizer(self, corpus: Corpus) -> spm.SentencePieceProcessor:
        with self.stages("bpe"):
            cached = None if self.spm_path.is_file() else self._bpe_entry(corpus)  # a resumed run has its own
            processor, origin = train_or_load(
                self.spm_path, self._bpe_texts(corpus), self.cfg.vocab_size, self.cfg.spm_input_sentence_size,
                seed=BPE_SEED, cached=cached)
            self.bpe_origin = self.bpe_origin or origin  # prepare_data's, not setup's reload of it
            return processor

    def setup(self, stage: str | None = None) -> None:
        """Load the corpus, train-or-load the tokenizer and encode every split (idempotent)."""
        if self._ready:
            return
        start = time.perf_counter()
        corpus = self._load()
        self.tokenizer = self._tokenizer(corpus)
        self.vocab_size = self.tokenizer.get_piece_size()
        train_limit = min(self.cfg.max_train_len, self.max_len - 1)
        with self.stages("encode"):
            # what every split's cache key shares: this run's BPE model and the encoding code, read once
            encoder = cache.key("encoded", self.spm_path.read_bytes(), spm.__version__, cache.source(sys.modules[__name__]))
            parts = {"train": corpus.train, "extra_train": corpus.extra_train}
            train = concatenate([self._encode_split(part, name, encoder) for name, part in parts.items()
                                 if part is not None])
            self.train_set, train_dropped = self._filter(train, train_limit)
            self.valid_set, valid_dropped = self._filter(self._encode_split(corpus.valid, "valid", encoder),
                                                         self.max_len - 1)
        self._check_left("training", self.train_set, train_dropped, train_limit,
                         f"data.max_train_len ({self.cfg.max_train_len}) or model.max_len ({self.max_len})")
        self._check_left("dev", self.valid_set, valid_dropped, self.max_len - 1, f"model.max_len ({self.max_len})")
        for split, kept in (("training", self.train_set), ("dev", self.valid_set)):
            self._check_budget(split, kept)
        with self.stages("batches"):
            if self.cfg.shape_buckets:
                self.buckets = ShapeBuckets.fit(self.train_set.src_lengths, self.train_set.tgt_lengths,
                                                self.cfg.shape_buckets, self.cfg.max_tokens, self.pad_multiple)
            self.stats = self._statistics(corpus, train_dropped, valid_dropped, train_limit)
        self.stats["stages"] = list(self.stages.done)  # not the later reloads (prepare_data)
        self.stats["prepared"] = {"bpe": self.bpe_origin, "encoded_from_cache": list(self.from_cache)}
        self.stats["setup_seconds"] = round(time.perf_counter() - start, 2)
        self._ready = True

    def _statistics(self, corpus: Corpus, train_dropped: int, valid_dropped: int,
                    train_limit: int) -> dict[str, Any]:
        """What a run records about its data: sizes, the epoch's batches and their padding."""
        sampler = TokenBucketBatchSampler(self.train_set.src_lengths, self.train_set.tgt_lengths,
                                          self.cfg.max_tokens, shuffle=True, seed=self.seed,
                                          num_replicas=1, rank=0, pad_multiple=self.pad_multiple,
                                          buckets=self.buckets)
        batches = sampler.global_batches()
        valid_sampler = TokenBucketBatchSampler(self.valid_set.src_lengths,
                                                self.valid_set.tgt_lengths, self.cfg.max_tokens,
                                                shuffle=False, num_replicas=1, rank=0,
                                                pad_multiple=self.pad_multiple)
        lengths = (self.train_set.src_lengths, self.train_set.tgt_lengths)
        shapes = batch_shapes(batches, *lengths, self.pad_multiple, self.buckets)
        return {
            "corpus": corpus.name,
            "train_pairs": len(corpus.train),
            "extra_train_pairs": len(corpus.extra_train) if corpus.extra_train is not None else 0,
            "valid_pairs": len(corpus.valid),
            "test_pairs": len(corpus.test),
            "train_examples": len(self.train_set),
            "dropped_for_length": train_dropped,
            "valid_dropped_for_length": valid_dropped,
            "max_train_len": train_limit,
            "vocab_size": self.vocab_size,
            "train_tokens": int(self.train_set.src_lengths.sum()
                                + self.train_set.tgt_lengths.sum()),
            "train_batches": len(batches),
            "pad_multiple": self.pad_multiple,
            "shape_buckets": self.cfg.shape_buckets,
            "train_padding_share": padding_share(batches, *lengths, self.pad_multiple, self.buckets),
            # distinct (rows, source length, target length) tensor shapes in one epoch
            "train_shapes": len(set(shapes)),
            "train_lengths": len({shape[1:] for shape in shapes}),
            "valid_padding_share": padding_share(valid_sampler.global_batches(),
                                                 self.valid_set.src_lengths,
                                                 self.valid_set.tgt_lengths, self.pad_multiple),
            # a model that ignores source and context (EOS included): the rule's "diverged" line
            "unigram_ppl": round(unigram_perplexity(self.train_set._tgt, len(self.train_set),
                                                    self.vocab_size), 3),
            "setup_seconds": 0.0,
        }

    @property
    def corpus(self) -> Corpus:
        """The raw text of every split (BLEU references come from here)."""
        return self._load()

    def encode(self, texts: list[str]) -> list[list[int]]:
        """Wordpiece ids of each text, without BOS/EOS."""
        return self.tokenizer.encode(list(texts), num_threads=os.cpu_count() or 1)

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text up to the first EOS, with PAD/BOS/EOS skipped."""
        ids = [int(i) for i in ids]
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        return self.tokenizer.decode([i for i in ids if i not in (PAD_ID, BOS_ID)])

    def _encode_split(self, split: ParallelText, name: str, encoder: str) -> EncodedPairs:
        """The split `name` encoded with this run's BPE model (key `encoder`), from the cache if there."""
        digest = cache.key(encoder, self._digest(split))
        path = cache.entry(self.cfg.cache_dir, "encoded", f"{digest}.npz")
        pairs = read_encoded(path, len(split), self.vocab_size)
        if pairs is None:
            pairs = self._encode_fresh(split)
            cache.store(path, lambda file: np.savez(file, **pairs.arrays()))
        else:
            self.from_cache.append(name)
        return pairs

    def _encode_fresh(self, split: ParallelText) -> EncodedPairs:
        """Both sides encoded and packed `ENCODE_CHUNK` sentences at a time (1M pairs' lists: ~2.5 GB)."""
        sides = []
        for texts in (split.src, split.tgt):
            chunks = [EncodedPairs._pack(self.encode(texts[start:start + ENCODE_CHUNK]))
                      for start in range(0, len(texts), ENCODE_CHUNK)]
            sides += [np.concatenate([c[0] for c in chunks] or [np.zeros(0, np.int64)]),
                      np.concatenate([c[1] for c in chunks] or [np.zeros(0, np.int32)])]
        return EncodedPairs.from_arrays(*sides)

    @staticmethod
    def _filter(pairs: EncodedPairs, limit: int) -> tuple[EncodedPairs, int]:
        """The pairs with at most `limit` wordpieces on both sides, and how many were dropped."""
        keep = (pairs.src_lengths <= limit) & (pairs.tgt_lengths <= limit)
        return pairs.select(keep), int(len(pairs) - keep.sum())

    @property
    def batch_tokens(self) -> int:
        """Tokens per side of one batch: `data.max_tokens` over the batches a step is split into."""
        return self.cfg.max_tokens // self.micro_batches

    def split_steps(self, micro_batches: int) -> None:
        """Split each step's `data.max_tokens` into `micro_batches` batches (devices × accumulation)."""
        self.micro_batches = max(1, micro_batches)
        for split, kept in (("training", self.train_set), ("dev", self.valid_set)):
            self._check_budget(split, kept)

    def _check_budget(self, split: str, kept: EncodedPairs) -> None:
        """Every pair must fit a batch of `batch_tokens` (its longer side with BOS/EOS, rounded up to
        `data.pad_multiple`): a wider one would make a batch of its own over the cap, unseen."""
        widest = int(np.maximum(kept.src_lengths, kept.tgt_lengths).max()) + 1
        widest = -(-widest // self.pad_multiple) * self.pad_multiple
        if widest > self.batch_tokens:
            shared = (f" shared by {self.micro_batches} batches a step (devices x train.accumulate_grad_batches), "
                      f"{self.batch_tokens} each," if self.micro_batches > 1 else "")
            raise UserError(f"data.max_tokens={self.cfg.max_tokens}{shared} is smaller than the longest {split} "
                            f"pair ({widest} tokens on a side, with BOS/EOS); raise data.max_tokens to at least "
                            f"{widest * self.micro_batches}, or lower data.max_train_len or model.max_len")

    @staticmethod
    def _check_left(split: str, kept: EncodedPairs, dropped: int, limit: int, limited_by: str) -> None:
        """A split that the length filter emptied would train or validate on nothing: refuse it."""
        if not len(kept):
            raise UserError(f"no {split} pairs left: all {dropped:,} are longer than {limit} wordpieces "
                            f"on a side; raise {limited_by}")
