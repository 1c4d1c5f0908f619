"""Agreement with the paper beside what a table with no knowledge of it would score (docs/table3.md),
and Spearman's ρ with a seeded one-sided permutation p (the same table, the same report bytes)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from reports.significance import SEED

N_PERMUTATIONS = 9999


@dataclass(frozen=True)
class Signs:
    """Sign agreement over the rows where the paper's difference is clear."""

    agree: int  # k: rows whose ΔPPL has the paper's sign
    rows: int  # n: rows where the paper's difference is clear
    worse_agree: int  # of the rows the paper found worse than base, how many of ours are too
    worse: int
    better_agree: int  # of the rows the paper found better than base, how many of ours are too
    better: int
    p_random: float  # P(k or more of n) when every sign is a fair coin

    @property
    def every_change_hurts(self) -> int:
        """What a table where every change is worse than base scores on the same rows."""
        return self.worse

    def sentence(self) -> str:
        """k of n, split by the paper's direction, beside both baselines."""
        margin = self.agree - self.every_change_hurts
        verdict = (f"ours beats it by {margin} row{'s' * (margin != 1)}" if margin > 0
                   else "ours does not beat it" if margin == 0 else f"ours scores {-margin} fewer")
        return (f"our PPL change has the paper's sign for {self.agree} of the {self.rows} rows where the paper's "
                f"difference is clear ({self.worse_agree} of the {self.worse} it found worse than base, "
                f"{self.better_agree} of the {self.better} it found better); a table where every change is worse "
                f"than base scores {self.every_change_hurts} of {self.rows}, so {verdict}; random signs reach "
                f"{self.agree} or more with p = {self.p_random:.3f}")


def signs(frame: pd.DataFrame, metric: str = "ppl") -> Signs | None:
    """The sign agreement of `{metric}_sign_agrees` by `d_paper_{metric}`; None: no row compared."""
    column = f"{metric}_sign_agrees"
    if column not in frame:
        return None
    rows = frame.drop(index="base", errors="ignore")
    comparable = rows[rows[column].notna()]
    if comparable.empty:
        return None
    agrees = comparable[column].astype(bool)
    worse = comparable[f"d_paper_{metric}"] > 0
    k, n = int(agrees.sum()), len(comparable)
    return Signs(agree=k, rows=n, worse_agree=int(agrees[worse].sum()), worse=int(worse.sum()),
                 better_agree=int(agrees[~worse].sum()), better=int((~worse).sum()),
                 p_random=float(stats.binomtest(k, n, 0.5, alternative="greater").pvalue))


@dataclass(frozen=True)
class Rank:
    rho: float
    rows: int
    p: float  # one-sided permutation p of a rho this large or larger

    def text(self, rows: str = "rows") -> str:
        """'+0.310 over 20 rows (permutation p = 0.088)'; `rows` names which (the converged ones)."""
        over = f"over {'the ' * (rows != 'rows')}{self.rows} {rows}"
        if math.isnan(self.rho):
            return f"n/a {over}"
        return f"{self.rho:+.3f} {over} (permutation p = {self.p:.3f})"


def spearman(frame: pd.DataFrame, ours: str, paper: str) -> Rank:
    """Spearman's rho over the rows with both values, with its one-sided permutation p (or nan)."""
    both = frame[[ours, paper]].dropna()
    if len(both) < 3 or both[ours].nunique() < 2 or both[paper].nunique() < 2:
        return Rank(math.nan, len(both), math.nan)
    x, y = both[ours].to_numpy(dtype=float), both[paper].to_numpy(dtype=float)
    ranked_y = stats.rankdata(y)

    def rho(a: np.ndarray, axis: int = -1) -> np.ndarray:
        """Spearman's rho of each row of `a` (our values, in some pairing) with the paper's."""
        return _pearson(stats.rankdata(a, axis=axis), ranked_y)

    test = stats.permutation_test((x,), rho, permutation_type="pairings", vectorized=True,
                                  n_resamples=N_PERMUTATIONS, alternative="greater", rng=np.random.default_rng(SEED))
    return Rank(float(stats.spearmanr(x, y).statistic), len(both), float(test.pvalue))


def _pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson's r of each row of `a` (last axis) with `b`."""
    a = a - a.mean(axis=-1, keepdims=True)
    b = b - b.mean()
    return (a * b).sum(axis=-1) / np.sqrt((a * a).sum(axis=-1) * (b * b).sum())
