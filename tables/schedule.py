"""The order a table's runs start in, and the wall-clock that order takes on N workers.

Longest first: the queue holds the runs by their training FLOPs, most first, so each free worker
takes the longest run left and the big model starts at once instead of last. For independent runs
on identical workers this is Graham's LPT rule (1969): its wall-clock is within 4/3 of the best
possible, and close to max(total / N, longest run) when the runs outnumber the workers.

`ablate table3` queues its runs in this order (`tables.plan.queue`; workers take queued trials
oldest first), and its dry run replays the same order on N workers (`wall_clock`), so the plan
and the launcher cannot disagree about which run goes where.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Mapping
from typing import TypeVar

from lightning_modules.config import RunConfig, count_parameters

K = TypeVar("K", bound=Hashable)


def parameters(cfg: RunConfig) -> int:
    """The run's parameter count with the BPE vocabulary the tokenizer will have."""
    return count_parameters(cfg.model.with_vocabulary(cfg.data.vocab_size, cfg.model.pad_id))


def tokens_per_step(cfg: RunConfig) -> int:
    """The token budget of one optimizer step: `data.max_tokens`, however many devices and
    accumulated batches share it (`lightning_modules.config.step_batches`)."""
    return cfg.data.max_tokens


def training_flops(cfg: RunConfig) -> float:
    """Training FLOPs ≈ 6 · parameters · target tokens (an upper bound: batches fill their budget
    to ~95%)."""
    return 6.0 * parameters(cfg) * cfg.train.max_steps * tokens_per_step(cfg)


def longest_first(costs: Mapping[K, float], first: Iterable[K] = ()) -> list[K]:
    """The keys of `costs` (a run's FLOPs or seconds) in start order: those in `first` (runs that
    only need adopting, seconds each), then the costliest; ties keep their given order."""
    early = set(first)
    order = {key: i for i, key in enumerate(costs)}
    return sorted(costs, key=lambda key: (key not in early, -costs[key], order[key]))


def wall_clock(seconds: Iterable[float], workers: int) -> float:
    """How long runs of these durations take on `workers` workers that each take the next run, in
    the order given, as soon as they are free."""
    free_at = [0.0] * max(1, workers)
    for duration in seconds:
        start = heapq.heappop(free_at)
        heapq.heappush(free_at, start + duration)
    return max(free_at)
