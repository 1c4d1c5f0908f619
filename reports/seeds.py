"""Seeds as noise: mean ± 95% t interval per row, the difference to base with its interval, and the
paper's sign (compared only where its difference is at least `PAPER_THRESHOLD`: single runs)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import stats

PAPER_THRESHOLD = {"ppl": 0.15, "bleu": 0.3}  # |paper row − paper base| that counts as a difference


def t_quantile(df: float) -> float:
    """t_{0.975} for `df` degrees of freedom (a fractional Welch df rounded down, as a t table is
    read: the interval is never the narrower for it)."""
    if df < 1:
        return math.nan
    return float(stats.t.ppf(0.975, math.floor(df)))


def t_p_value(mean: float, se: float, df: float) -> float:
    """Two-sided p of the t test whose 95% interval is mean ± t_quantile(df) * se."""
    if df < 1 or math.isnan(mean) or math.isnan(se):
        return math.nan
    if se == 0:
        return 0.0 if mean else 1.0
    return float(2 * stats.t.sf(abs(mean) / se, math.floor(df)))


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    @property
    def excludes_zero(self) -> bool:
        return bool(not math.isnan(self.low) and (self.low > 0 or self.high < 0))  # a bool, not numpy's


def mean_ci(values: Sequence[float]) -> Interval:
    """Mean and its 95% t interval (nan bounds with fewer than two values)."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(mean, math.nan, math.nan, n)
    half = t_quantile(n - 1) * statistics.stdev(values) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def difference_ci(row: Mapping[int, float], base: Mapping[int, float]) -> tuple[Interval, str]:
    """Row − base (keyed by seed), its 95% interval and the method (paired, welch or base noise)."""
    shared = sorted(set(row) & set(base))
    if len(shared) >= 2 and len(shared) == len(row) == len(base):
        return mean_ci([row[s] - base[s] for s in shared]), "paired"
    a, b = list(row.values()), list(base.values())
    if not a or not b:
        return Interval(math.nan, math.nan, math.nan, 0), "none"
    diff = statistics.fmean(a) - statistics.fmean(b)
    if len(a) == 1 and len(b) >= 2:
        # the row assumed as noisy as base: base's 95% prediction interval for one more run
        half = t_quantile(len(b) - 1) * statistics.stdev(b) * math.sqrt(1 + 1 / len(b))
        return Interval(diff, diff - half, diff + half, 1), "base noise"
    if len(a) < 2 or len(b) < 2:
        return Interval(diff, math.nan, math.nan, min(len(a), len(b))), "welch"
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Interval(diff, diff, diff, min(len(a), len(b))), "welch"
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    half = t_quantile(df) * se
    return Interval(diff, diff - half, diff + half, min(len(a), len(b))), "welch"


def sign_agrees(ours: float, paper: float | None, metric: str = "ppl") -> bool | None:
    """Whether our difference to base has the paper's sign; None where the paper's is too small."""
    if paper is None or math.isnan(paper) or abs(paper) < PAPER_THRESHOLD[metric] or math.isnan(ours):
        return None
    # a bool, not numpy's: the table's columns hold these, and numpy's True + True is True
    return bool((ours > 0) == (paper > 0) and ours != 0)
