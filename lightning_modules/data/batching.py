"""Token-budget batching (fairseq `--max-tokens`) with per-epoch shuffling and rank sharding.

Example i is a pair (src_ids, tgt_ids) without special tokens. In a batch the source gets EOS
appended and the target gets BOS prepended (decoder input) or EOS appended (decoder output),
so each side is one token longer than its ids; the token budget counts those lengths.

With `pad_multiple` m > 1 every batch's source and target lengths are rounded up to a multiple
of m (GPU tensor cores and `torch.compile` see a few shapes instead of one per length); the
token budget counts the rounded lengths, so a batch never exceeds `max_tokens` slots.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def round_up(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """`lengths` rounded up to a multiple of `multiple` (1: unchanged)."""
    return lengths if multiple <= 1 else -(-lengths // multiple) * multiple


def cut_points(widths: np.ndarray, max_tokens: int) -> list[int]:
    """Greedy batch ends over `widths` (already sorted) so that size * max width <= max_tokens.

    A single example wider than max_tokens forms its own batch.
    """
    ends: list[int] = []
    size = widest = 0
    for position, width in enumerate(widths.tolist()):
        new_widest = max(widest, width)
        if size and (size + 1) * new_widest > max_tokens:
            ends.append(position)
            size, new_widest = 0, width
        size += 1
        widest = new_widest
    if size:
        ends.append(len(widths))
    return ends


class TokenBucketBatchSampler(Sampler[list[int]]):
    """Batches of similar-length examples under a token budget, sharded across ranks.

    Examples are sorted by length and cut greedily so that batch_size * max(longest source,
    longest target) <= max_tokens, counting BOS/EOS. The sort key is the example's width
    max(source, target), then the source-target difference in alternating ("snake") direction
    from one width to the next, so consecutive examples have similar lengths on BOTH sides; on
    the Ding sentences this halves the padding of a plain (target, source) sort. Ties are
    broken by a permutation seeded with `seed + epoch`, so equal-length examples regroup every
    epoch while the batch boundaries stay fixed (the sorted length sequence is the same). With
    shuffle=True the order of the batches is shuffled per epoch with `seed + epoch`; with
    shuffle=False both the grouping and the order are fixed. Every rank builds the same batch
    list and takes every `num_replicas`-th batch; the list is padded by wrapping around so all
    ranks get the same number of batches.
    """

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int,
                 shuffle: bool = True, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None, pad_multiple: int = 1) -> None:
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError(f"{len(src_lengths)} source lengths but {len(tgt_lengths)} target")
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        distributed = dist.is_available() and dist.is_initialized()
        if num_replicas is None:
            num_replicas = dist.get_world_size() if distributed else 1
        if rank is None:
            rank = dist.get_rank() if distributed else 0
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside [0, {num_replicas})")
        self.src_lengths = np.asarray(src_lengths, dtype=np.int64) + 1  # + EOS
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64) + 1  # + BOS (in) / EOS (out)
        self.max_tokens = max_tokens
        self.pad_multiple = max(1, pad_multiple)
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches done) for the next __iter__
        # Ties only permute examples with equal (tgt, src) lengths, so the sorted length sequence
        # and hence the batch boundaries are the same in every epoch: compute them once.
        order = self._sorted_order(None)
        widths = round_up(np.maximum(self.src_lengths[order], self.tgt_lengths[order]),
                          self.pad_multiple)
        self._ends = cut_points(widths, max_tokens)

    @property
    def sampler(self) -> TokenBucketBatchSampler:
        """Lightning calls `set_epoch` on `dataloader.batch_sampler.sampler`: point it here."""
        return self

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose grouping and batch order `__iter__` yields."""
        self.epoch = epoch

    def resume_at(self, epoch: int, batches: int) -> None:
        """The next pass, if it is over `epoch`, starts after this rank's first `batches` batches
        (a run resumed mid-epoch; `lightning_modules.resume`)."""
        self._resume = (epoch, batches)

    def _sorted_order(self, rng: np.random.Generator | None) -> np.ndarray:
        """Indices sorted by (width, snake difference); ties in a random (rng) or index order."""
        n = len(self.src_lengths)
        base = rng.permutation(n) if rng is not None else np.arange(n)
        src, tgt = self.src_lengths[base], self.tgt_lengths[base]
        width = np.maximum(src, tgt)
        snake = np.where(width % 2 == 0, src - tgt, tgt - src)
        return base[np.lexsort((snake, width))]  # lexsort is stable: ties keep `base` order

    def global_batches(self) -> list[list[int]]:
        """All batches of the current epoch, in order, before sharding."""
        rng = np.random.default_rng(self.seed + self.epoch) if self.shuffle else None
        order = self._sorted_order(rng)
        chunks = np.split(order, self._ends[:-1]) if self._ends else []
        batches = [chunk.tolist() for chunk in chunks]
        if rng is not None:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.global_batches()
        if not batches:
            return iter(())
        total = len(self) * self.num_replicas
        padded = list(itertools.islice(itertools.cycle(batches), total))
        skip = self._resume[1] if self._resume and self._resume[0] == self.epoch else 0
        self._resume = None
        return iter(padded[self.rank::self.num_replicas][skip:])

    def __len__(self) -> int:
        return math.ceil(len(self._ends) / self.num_replicas)


def batch_shapes(batches: Iterable[list[int]], src_lengths: Sequence[int],
                 tgt_lengths: Sequence[int], pad_multiple: int = 1) -> list[tuple[int, int, int]]:
    """(rows, source length, target length) of the tensors each batch collates to."""
    src = round_up(np.asarray(src_lengths, dtype=np.int64) + 1, pad_multiple)
    tgt = round_up(np.asarray(tgt_lengths, dtype=np.int64) + 1, pad_multiple)
    shapes = []
    for batch in batches:
        index = np.asarray(batch, dtype=np.int64)
        shapes.append((len(index), int(src[index].max()), int(tgt[index].max())))
    return shapes


def padding_share(batches: Iterable[list[int]], src_lengths: Sequence[int],
                  tgt_lengths: Sequence[int], pad_multiple: int = 1) -> float:
    """Padded slots / all slots of the `src` and `tgt_out` tensors these batches collate to."""
    batches = list(batches)
    src = np.asarray(src_lengths, dtype=np.int64) + 1
    tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1
    slots = sum(rows * (s + t) for rows, s, t in
                batch_shapes(batches, src_lengths, tgt_lengths, pad_multiple))
    used = sum(int(src[b].sum()) + int(tgt[b].sum()) for b in map(np.asarray, batches))
    return (slots - used) / slots if slots else 0.0


def _place(rows: int, width: int, seqs: list[list[int]], pad_id: int, before: int | None,
           after: int | None) -> np.ndarray:
    """(rows, width) array of `seqs` right-padded, optionally with a token before/after each."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=rows)
    out = np.full((rows, width), pad_id, dtype=np.int64)
    start = 1 if before is not None else 0
    if before is not None:
        out[:, 0] = before
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int64, count=int(lengths.sum()))
    row_of = np.repeat(np.arange(rows), lengths)
    col_of = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out[row_of, col_of + start] = flat
    if after is not None:
        out[np.arange(rows), lengths + start] = after
    return out


def collate(examples: list[tuple[list[int], list[int]]], pad_id: int = PAD_ID,
            pad_multiple: int = 1) -> dict[str, torch.Tensor | int]:
    """Right-padded `src` (ids+EOS), `tgt_in` (BOS+ids), `tgt_out` (ids+EOS) and `n_tokens`.

    Vectorised (no per-sentence tensors): a 25K-token batch collates in about a millisecond.
    `n_tokens` (real target tokens) is a Python int, so counting it never waits for a GPU.
    """
    size = len(examples)
    srcs = [s for s, _ in examples]
    tgts = [t for _, t in examples]
    src_len = int(round_up(np.array(max(map(len, srcs)) + 1), pad_multiple))
    tgt_len = int(round_up(np.array(max(map(len, tgts)) + 1), pad_multiple))
    return {"src": torch.from_numpy(_place(size, src_len, srcs, pad_id, None, EOS_ID)),
            "tgt_in": torch.from_numpy(_place(size, tgt_len, tgts, pad_id, BOS_ID, None)),
            "tgt_out": torch.from_numpy(_place(size, tgt_len, tgts, pad_id, None, EOS_ID)),
            "n_tokens": sum(map(len, tgts)) + size}
