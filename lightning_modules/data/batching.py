"""Token-budget batching (fairseq `--max-tokens`) with per-epoch shuffling and rank sharding; budgets
count EOS/BOS, and `ShapeBuckets` give static shapes (docs/gpu-performance.md)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from lightning_modules.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def round_up(lengths: np.ndarray, multiple: int) -> np.ndarray:
    """`lengths` rounded up to a multiple of `multiple` (1: unchanged)."""
    return lengths if multiple <= 1 else -(-lengths // multiple) * multiple


def bucket_lengths(lengths: np.ndarray, count: int, multiple: int = 1) -> tuple[int, ...]:
    """The `count` lengths (multiples of `multiple`) padding `lengths` least: an exact dynamic programme."""
    values, counts = np.unique(round_up(np.asarray(lengths, dtype=np.int64), multiple),
                               return_counts=True)
    if count >= len(values):
        return tuple(int(v) for v in values)
    n = len(values)
    below = np.concatenate([[0], np.cumsum(counts)])  # examples with a value index < i
    total = np.concatenate([[0], np.cumsum(counts * values)])
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    # cost[i, j] (n, n): values i..j all padded to values[j]; inf where i > j
    cost = np.where(i <= j, values[j] * (below[j + 1] - below[i]) - (total[j + 1] - total[i]),
                    np.inf)
    best = cost[0].astype(float)
    choices = []  # per round, for each last edge j: the first value index of its run
    for _ in range(1, count):
        candidates = np.full((n, n), np.inf)
        candidates[1:] = best[:-1, None] + cost[1:]  # previous edge at i - 1, this run i..j
        choices.append(np.argmin(candidates, axis=0))
        best = candidates.min(axis=0)
    edges, j = [int(values[-1])], n - 1
    for choice in reversed(choices):
        j = int(choice[j]) - 1
        edges.append(int(values[j]))
    return tuple(sorted(set(edges)))


@dataclass(frozen=True)
class ShapeBuckets:
    """Static batch shapes: padded side lengths (EOS/BOS included, ascending) and the token budget."""

    src: tuple[int, ...]
    tgt: tuple[int, ...]
    max_tokens: int

    @classmethod
    def fit(cls, src_lengths: Sequence[int], tgt_lengths: Sequence[int], count: int,
            max_tokens: int, multiple: int = 1) -> ShapeBuckets:
        """`count` `bucket_lengths` per side for a corpus's lengths of ids (without specials)."""
        src = np.asarray(src_lengths, dtype=np.int64) + 1
        tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1
        return cls(bucket_lengths(src, count, multiple), bucket_lengths(tgt, count, multiple),
                   max_tokens)

    def with_budget(self, max_tokens: int) -> ShapeBuckets:
        return replace(self, max_tokens=max_tokens)

    def pad(self, src: np.ndarray | int, tgt: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """The bucket lengths (S, T) sides of these lengths are padded to (ValueError beyond the longest)."""
        src, tgt = np.asarray(src, dtype=np.int64), np.asarray(tgt, dtype=np.int64)
        if src.size and (src.max() > self.src[-1] or tgt.max() > self.tgt[-1]):
            raise ValueError(f"lengths ({int(src.max())}, {int(tgt.max())}) exceed the longest "
                             f"shape bucket ({self.src[-1]}, {self.tgt[-1]})")
        return (np.asarray(self.src)[np.searchsorted(self.src, src)],
                np.asarray(self.tgt)[np.searchsorted(self.tgt, tgt)])

    def rows(self, src: np.ndarray | int, tgt: np.ndarray | int) -> np.ndarray:
        """Rows of a batch of bucket lengths (S, T): as many as max_tokens holds, at least 1."""
        return np.maximum(1, self.max_tokens // np.maximum(src, tgt))


@dataclass(frozen=True)
class BucketPlan:
    """How a corpus's examples fill the (S, T) cells of `ShapeBuckets`, the same every epoch: a cell's
    leftover moves on to the smallest other cell that holds it, filling partial batches with
    neighbours rather than empty rows."""

    counts: tuple[int, ...]  # own examples per cell
    keep: tuple[int, ...]  # examples batched in the cell (own + carried in - carried on)
    target: tuple[int, ...]  # where each cell's leftover goes (-1: nowhere)
    rows: tuple[int, ...]  # each cell's batch rows
    sizes: tuple[int, ...]  # every batch's example count, cell after cell

    @classmethod
    def of(cls, src: np.ndarray, tgt: np.ndarray, buckets: ShapeBuckets) -> BucketPlan:
        """The plan for examples whose bucket lengths are `src`, `tgt`."""
        cells, counts = np.unique(np.stack([src, tgt], axis=1), axis=0, return_counts=True)
        rows = buckets.rows(cells[:, 0], cells[:, 1])
        incoming = np.zeros(len(cells), dtype=np.int64)
        keep, target, sizes = [], [], []
        for c, (s_len, t_len) in enumerate(cells.tolist()):
            holds = np.flatnonzero((cells[:, 0] >= s_len) & (cells[:, 1] >= t_len))
            holds = holds[holds != c]
            to = int(holds[np.argmin(cells[holds].sum(axis=1))]) if len(holds) else -1
            total, r = int(counts[c] + incoming[c]), int(rows[c])
            # every batch gets one of the cell's own examples, which gives it the cell's shape
            batches = min(total // r, int(counts[c]))
            kept = batches * r if to >= 0 else total
            if to >= 0:
                incoming[to] += total - kept
            keep.append(kept)
            target.append(to)
            sizes += [r] * (kept // r) + ([kept % r] if kept % r else [])
        return cls(tuple(int(n) for n in counts), tuple(keep), tuple(target),
                   tuple(int(r) for r in rows), tuple(sizes))

    def arrange(self, order: np.ndarray) -> np.ndarray:
        """`order` (sorted by cell) in the batches' order, one own example heading each cell's batch."""
        runs = np.split(order, np.cumsum(self.counts)[:-1])
        incoming: list[list[np.ndarray]] = [[] for _ in runs]
        parts = []
        for c, run in enumerate(runs):
            run = np.concatenate([run, *incoming[c]])
            if self.target[c] >= 0:
                incoming[self.target[c]].append(run[self.keep[c]:])
            r = self.rows[c]
            batches = -(-self.keep[c] // r)
            heads, rest = run[:batches], run[batches:self.keep[c]]
            for i in range(batches):
                parts += [heads[i:i + 1], rest[i * (r - 1):(i + 1) * (r - 1)]]
        return np.concatenate(parts) if parts else order


def cut_points(widths: np.ndarray, max_tokens: int) -> list[int]:
    """Greedy batch ends over sorted `widths` so that size * max width <= max_tokens (or one example)."""
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
    """Batches of similar-length examples under a token budget, sharded across ranks: sorted by width,
    then by the source-target difference in alternating ("snake") direction (half a plain sort's
    padding on Ding), or by cell (`BucketPlan`); ties broken by a permutation of `seed + epoch`, so
    examples regroup every epoch while the batch boundaries stay."""

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int,
                 shuffle: bool = True, seed: int = 0, num_replicas: int | None = None,
                 rank: int | None = None, pad_multiple: int = 1,
                 buckets: ShapeBuckets | None = None) -> None:
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
        self.buckets = buckets.with_budget(max_tokens) if buckets is not None else None
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches done) for the next __iter__
        # ties only permute equal lengths: the batch boundaries are every epoch's, computed once
        order = self._sorted_order(None)
        if self.buckets is not None:
            self._plan = BucketPlan.of(*self.buckets.pad(self.src_lengths[order],
                                                         self.tgt_lengths[order]), self.buckets)
            self._ends = np.cumsum(self._plan.sizes).tolist()
        else:
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
        """The next pass, if over `epoch`, starts after this rank's first `batches` (a resumed run)."""
        self._resume = (epoch, batches)

    def _sorted_order(self, rng: np.random.Generator | None) -> np.ndarray:
        """Indices sorted by (width, snake difference), or by cell; ties in `rng`'s or index order."""
        n = len(self.src_lengths)
        base = rng.permutation(n) if rng is not None else np.arange(n)
        src, tgt = self.src_lengths[base], self.tgt_lengths[base]
        if self.buckets is not None:
            return base[np.lexsort(self.buckets.pad(src, tgt)[::-1])]  # by (S, T)
        width = np.maximum(src, tgt)
        snake = np.where(width % 2 == 0, src - tgt, tgt - src)
        return base[np.lexsort((snake, width))]  # lexsort is stable: ties keep `base` order

    def global_batches(self) -> list[list[int]]:
        """All batches of the current epoch, in order, before sharding."""
        rng = np.random.default_rng(self.seed + self.epoch) if self.shuffle else None
        order = self._sorted_order(rng)
        if self.buckets is not None:
            order = self._plan.arrange(order)
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


def batch_shape(src: np.ndarray, tgt: np.ndarray, pad_multiple: int = 1,
                buckets: ShapeBuckets | None = None) -> tuple[int, int, int]:
    """(rows, source length, target length) that a batch of these lengths (specials included) collates to."""
    s_max, t_max = int(np.max(src)), int(np.max(tgt))
    if buckets is None:
        return len(src), int(round_up(np.array(s_max), pad_multiple)), int(round_up(np.array(t_max), pad_multiple))
    s_len, t_len = (int(x) for x in buckets.pad(s_max, t_max))
    return int(buckets.rows(s_len, t_len)), s_len, t_len


def batch_shapes(batches: Iterable[list[int]], src_lengths: Sequence[int],
                 tgt_lengths: Sequence[int], pad_multiple: int = 1,
                 buckets: ShapeBuckets | None = None) -> list[tuple[int, int, int]]:
    """(rows, source length, target length) of the tensors each batch collates to."""
    src = np.asarray(src_lengths, dtype=np.int64) + 1
    tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1
    return [batch_shape(src[index], tgt[index], pad_multiple, buckets)
            for index in (np.asarray(batch, dtype=np.int64) for batch in batches)]


def padding_share(batches: Iterable[list[int]], src_lengths: Sequence[int],
                  tgt_lengths: Sequence[int], pad_multiple: int = 1,
                  buckets: ShapeBuckets | None = None) -> float:
    """Padded slots / all slots of the `src` and `tgt_out` tensors these batches collate to."""
    batches = list(batches)
    src = np.asarray(src_lengths, dtype=np.int64) + 1
    tgt = np.asarray(tgt_lengths, dtype=np.int64) + 1
    slots = sum(rows * (s + t) for rows, s, t in
                batch_shapes(batches, src_lengths, tgt_lengths, pad_multiple, buckets))
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
            pad_multiple: int = 1, buckets: ShapeBuckets | None = None
            ) -> dict[str, torch.Tensor | int]:
    """Right-padded `src`, `tgt_in`, `tgt_out` and `n_tokens` (a host int) in `batch_shape`'s shape; an
    empty row keeps a source EOS, as a fully masked attention row is NaN in some SDPA kernels."""
    size = len(examples)
    srcs = [s for s, _ in examples]
    tgts = [t for _, t in examples]
    rows, src_len, tgt_len = batch_shape(np.fromiter(map(len, srcs), np.int64, size) + 1,
                                         np.fromiter(map(len, tgts), np.int64, size) + 1,
                                         pad_multiple, buckets)
    if rows < size:
        raise ValueError(f"{size} examples do not fit the {rows} rows of their shape bucket")
    empty = [[]] * (rows - size)
    tgt_out = _place(rows, tgt_len, tgts + empty, pad_id, None, EOS_ID)
    tgt_out[size:] = pad_id
    return {"src": torch.from_numpy(_place(rows, src_len, srcs + empty, pad_id, None, EOS_ID)),
            "tgt_in": torch.from_numpy(_place(rows, tgt_len, tgts + empty, pad_id, BOS_ID, None)),
            "tgt_out": torch.from_numpy(tgt_out),
            "n_tokens": sum(map(len, tgts)) + size}
