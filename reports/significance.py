"""Is a row's BLEU different from base's? sacreBLEU's paired bootstrap on the saved translations.

With several seeds the test pools them: each row's translations of every seed it shares with
base are concatenated (and so are base's and the references), and the bootstrap resamples
(seed, sentence) pairs. sacreBLEU fixes its resampling seed (SACREBLEU_SEED, 12345 by default),
so the p-values are reproducible.

A row that scores exactly base's BLEU (identical translations, or both at 0 as in a smoke-scale
run) gets p = 1: nothing differs. sacreBLEU would print its floor, 1 / (n + 1): its statistic
counts resamples whose centred difference exceeds the observed one, and where every resample
scores the two the same, none does.
"""

from __future__ import annotations

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

from lightning_modules.errors import UserError
from reports.collect import Table3Data


BOOTSTRAP_BUDGET_BYTES = 2 ** 30  # sacreBLEU's resampling indices: resamples x sentences x 8 bytes


def check_bootstrap_budget(data: Table3Data, n_samples: int) -> None:
    """Refuse, before anything is resampled (or written), a `--bootstrap` whose resampling
    indices (`n_samples` x the paired sentences, 8 bytes each) exceed BOOTSTRAP_BUDGET_BYTES
    (100,000,000 resamples asked for a 37 GiB allocation)."""
    sentences = sum(len(hyps) for (row, _), (hyps, _) in data.translations.items() if row == "base")
    need = n_samples * sentences * 8
    if need > BOOTSTRAP_BUDGET_BYTES:
        most = BOOTSTRAP_BUDGET_BYTES // (8 * max(sentences, 1))
        raise UserError(f"--bootstrap {n_samples:,} over {sentences:,} paired dev sentences needs "
                        f"~{need / 2 ** 30:,.1f} GiB, more than the {BOOTSTRAP_BUDGET_BYTES // 2 ** 30} GiB "
                        f"budget; use --bootstrap {most:,} or fewer")


def paired_bootstrap(data: Table3Data, n_samples: int = 1000) -> dict[str, float]:
    """p-value of each row's dev BLEU against base's (rows without shared translations left out)."""
    base = {seed: pair for (row, seed), pair in data.translations.items() if row == "base"}
    rows = sorted({row for row, _ in data.translations if row != "base"})
    p_values: dict[str, float] = {}
    for row in rows:
        seeds = sorted(s for (r, s) in data.translations if r == row and s in base)
        if not seeds:
            continue
        hyps, base_hyps, refs = [], [], []
        for seed in seeds:
            row_hyp, row_ref = data.translations[(row, seed)]
            base_hyp, base_ref = base[seed]
            if row_ref != base_ref:  # another dev set: nothing to pair
                break
            hyps += row_hyp
            base_hyps += base_hyp
            refs += base_ref
        else:
            test = PairedTest([("base", base_hyps), (row, hyps)], {"BLEU": BLEU(tokenize="13a")},
                              [refs], test_type="bs", n_samples=n_samples)
            _, scores = test()
            base_result, row_result = scores["BLEU"]
            p_values[row] = 1.0 if row_result.score == base_result.score else float(row_result.p_value)
    return p_values


def missing_p(data: Table3Data, p_values: dict[str, float]) -> str | None:
    """Why rows other than base have no p (None if each has one, or base has no complete run)."""
    rows = [row for row in dict.fromkeys(data.runs["row"]) if row != "base" and row not in p_values]
    if not rows or "base" not in set(data.runs["row"]):
        return None
    base = sorted(seed for row, seed in data.translations if row == "base")
    if not base:
        return ("p vs base is empty: base's runs carry no dev translations (finished before runs kept "
                "them, or restored from results without them), so no row can be paired with base")
    return (f"p vs base is empty for {', '.join(rows)}: none of their runs carries dev translations of "
            f"a seed base has them for ({', '.join(map(str, base))}), or of the same dev set")
