"""Is a row different from base beyond noise? One test for dev PPL and dev BLEU over seeds and dev
sentences at once (docs/table3.md): the seeds' variance (`seeds.difference_ci`) plus the sentences',
from a seeded paired bootstrap with sacreBLEU's statistics (BLEU only: a run stores no sentence PPL).
Student's t with the seed level's degrees of freedom keeps the interval no narrower than the seeds'
own: three seeds are too few for a bootstrap's outer level."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
from sacrebleu.metrics import BLEU
from scipy import stats

from foundation.errors import UserError
from reports.collect import Table3Data
from reports.seeds import Interval, difference_ci, t_p_value, t_quantile

SEED = 12345  # sacreBLEU's own default resampling seed (SACREBLEU_SEED)


@dataclass(frozen=True)
class Difference:
    """A row's difference to base: the test's interval, pairing, standard errors and seed-level df."""

    interval: Interval
    method: str
    seed_se: float
    sentence_se: float | None
    df: float = math.nan

    @property
    def p(self) -> float:
        """The two-sided p-value: below 0.05 exactly when the interval excludes zero (nan: none)."""
        if math.isnan(self.interval.low):
            return math.nan
        se = math.sqrt(self.seed_se ** 2 + (self.sentence_se or 0.0) ** 2)
        return t_p_value(self.interval.mean, se, self.df)

    @property
    def beyond_noise(self) -> bool | None:
        """Whether the interval excludes zero; None where there is no interval (one seed on both sides)."""
        if math.isnan(self.interval.low):
            return None
        return self.interval.excludes_zero


ALPHA = 0.05  # every interval is 95%; after correction, a difference is beyond noise where its q is below this
METRICS = {"ppl": "dev PPL", "bleu": "dev BLEU"}


def add_corrected(frame: pd.DataFrame) -> None:
    """Adds each comparison's Benjamini–Hochberg q (`ppl_q`, `bleu_q`) over the family of p-values."""
    cells = [(row, metric) for metric in METRICS for row in frame.index
             if row != "base" and f"{metric}_p" in frame and not pd.isna(frame.loc[row, f"{metric}_p"])]
    for metric in METRICS:
        frame[f"{metric}_q"] = math.nan
    if cells:
        q = stats.false_discovery_control([float(frame.loc[row, f"{metric}_p"]) for row, metric in cells], method="bh")
        for (row, metric), value in zip(cells, q):
            frame.loc[row, f"{metric}_q"] = float(value)


def corrected(frame: pd.DataFrame, metric: str) -> pd.Series:
    """Per row, whether its `metric` difference is beyond noise after correction (q < ALPHA)."""
    column = f"{metric}_q"
    return frame[column] < ALPHA if column in frame else pd.Series(False, index=frame.index)


def family_size(frame: pd.DataFrame) -> int:
    """How many comparisons the correction was over (the q values the table holds)."""
    return int(sum(frame[f"{m}_q"].notna().sum() for m in METRICS if f"{m}_q" in frame))


BOOTSTRAP_BUDGET_BYTES = 2 ** 30  # sacreBLEU's resampling indices: resamples x sentences x 8 bytes


def check_bootstrap_budget(data: Table3Data, n_samples: int) -> None:
    """Refuse, before anything is resampled, a `--bootstrap` over BOOTSTRAP_BUDGET_BYTES of indices."""
    sentences = sum(len(hyps) for (row, _), (hyps, _) in data.translations.items() if row == "base")
    need = n_samples * sentences * 8
    if need > BOOTSTRAP_BUDGET_BYTES:
        most = BOOTSTRAP_BUDGET_BYTES // (8 * max(sentences, 1))
        raise UserError(f"--bootstrap {n_samples:,} over {sentences:,} paired dev sentences needs "
                        f"~{need / 2 ** 30:,.1f} GiB, more than the {BOOTSTRAP_BUDGET_BYTES // 2 ** 30} GiB "
                        f"budget; use --bootstrap {most:,} or fewer")


def difference(row: Mapping[int, float], base: Mapping[int, float],
               row_draws: Mapping[int, np.ndarray] | None = None,
               base_draws: Mapping[int, np.ndarray] | None = None) -> Difference:
    """The one test: row − base (keyed by seed), its 95% interval over seeds and, with draws, sentences."""
    seeds, method = difference_ci(row, base)
    half = seeds.half_width
    df = _seed_df(row, base, method)
    seed_se = half / t_quantile(df) if not math.isnan(half) and df >= 1 else math.nan
    sentence_se = None
    if row_draws is not None and base_draws is not None and set(row) <= set(row_draws) \
            and set(base) <= set(base_draws) and row and base:
        ours = np.mean([row_draws[s] for s in sorted(row)], axis=0)
        theirs = np.mean([base_draws[s] for s in sorted(base)], axis=0)
        sentence_se = float(np.std(ours - theirs, ddof=1)) if len(ours) > 1 else 0.0
    if math.isnan(seed_se):
        return Difference(seeds, method, seed_se, sentence_se, df)
    se = math.sqrt(seed_se ** 2 + (sentence_se or 0.0) ** 2)
    q = t_quantile(df)
    return Difference(Interval(seeds.mean, seeds.mean - q * se, seeds.mean + q * se, seeds.n), method,
                      seed_se, sentence_se, df)


def _seed_df(row: Mapping[int, float], base: Mapping[int, float], method: str) -> float:
    """The degrees of freedom of the seed level's t (as `difference_ci` chose them)."""
    if method == "paired":
        return len(row) - 1
    if method == "base noise":
        return len(base) - 1
    a, b = list(row.values()), list(base.values())
    if len(a) < 2 or len(b) < 2:
        return 0
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    if va + vb == 0:  # no spread on either side: the seed level adds nothing, whatever its df
        return len(a) + len(b) - 2
    return float((va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)))


def sentence_draws(data: Table3Data, n_samples: int = 1000) -> dict[tuple[str, int], np.ndarray]:
    """Each run's dev BLEU on `n_samples` resamples of base's dev sentences, keyed (row, seed)."""
    base = sorted(seed for row, seed in data.translations if row == "base")
    if not base or n_samples < 2:
        return {}
    refs = data.translations[("base", base[0])][1]
    runs = {key: hyps for key, (hyps, ref) in sorted(data.translations.items()) if ref == refs}
    rng = np.random.default_rng(SEED)
    # how often each sentence is drawn in each resample: (n_samples, sentences)
    counts = np.stack([np.bincount(rng.integers(0, len(refs), len(refs)), minlength=len(refs))
                       for _ in range(n_samples)])
    metric = BLEU(tokenize="13a")
    draws = {}
    for key, hyps in runs.items():
        stats = np.array(metric._extract_corpus_statistics(hyps, [refs]), dtype=np.int64)  # sacreBLEU's per-sentence statistics
        draws[key] = np.array([metric._compute_score_from_stats(list(total)).score for total in counts @ stats])
    return draws


def by_row(draws: Mapping[tuple[str, int], np.ndarray], row: str) -> dict[int, np.ndarray]:
    return {seed: d for (r, seed), d in draws.items() if r == row}


def missing_sentences(data: Table3Data, draws: Mapping[tuple[str, int], np.ndarray]) -> str | None:
    """Why rows have no sentence level in their BLEU test (None if every run has one)."""
    runs = list(zip(data.runs["row"], data.runs["seed"]))
    if not runs or "base" not in set(data.runs["row"]):
        return None
    order = list(dict.fromkeys(row for row, _ in runs))
    if any((row, seed) not in draws for row, seed in runs if row == "base"):  # then no row has one
        lacking = [row for row in order if row != "base"]
    else:
        lacking = [row for row in order if any((r, s) not in draws for r, s in runs if r == row)]
    if not lacking:
        return None
    return (f"BLEU's sentence level is not measured for {', '.join(lacking)}: a run of theirs or of base "
            f"stored no dev translations of base's dev set (finished before runs kept them), so their BLEU "
            f"interval is the seeds' alone")
