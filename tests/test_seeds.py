"""Seed statistics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from reports.seeds import difference_ci, mean_ci, sign_agrees, t_p_value, t_quantile

T2 = 4.302653  # t_{0.975} with 2 degrees of freedom, to six decimals (the tables' 4.303)


def test_mean_ci_three_seeds_by_hand():
    # values 10, 12, 14: mean 12, sample sd 2, se 2/sqrt(3) = 1.1547, t(2) = 4.302653 -> ±4.96828
    ci = mean_ci([10.0, 12.0, 14.0])
    assert ci.mean == 12.0 and ci.n == 3
    assert ci.half_width == pytest.approx(T2 * 2 / math.sqrt(3), rel=1e-6)
    assert ci.low == pytest.approx(12 - 4.96828, abs=1e-4) and ci.high == pytest.approx(16.96828, abs=1e-4)
    assert ci.excludes_zero


def test_one_seed_has_no_interval_and_claims_nothing():
    ci = mean_ci([5.0])
    assert ci.mean == 5.0 and math.isnan(ci.low) and not ci.excludes_zero
    diff, _ = difference_ci({1: 5.0}, {1: 4.0})
    assert diff.mean == 1.0 and not diff.excludes_zero


def test_one_seed_row_against_base_seeds_uses_base_noise_by_hand():
    # base 10, 12, 14: mean 12, sd 2; a new run's 95% prediction half-width is
    # t(2) * 2 * sqrt(1 + 1/3) = 4.302653 * 2.3094 = 9.93656
    diff, method = difference_ci({1: 23.0}, {1: 10.0, 2: 12.0, 3: 14.0})
    assert method == "base noise" and diff.mean == pytest.approx(11.0) and diff.n == 1
    assert diff.half_width == pytest.approx(T2 * 2 * math.sqrt(4 / 3), rel=1e-6)
    assert diff.low == pytest.approx(11.0 - 9.93656, abs=1e-4) and diff.excludes_zero
    near, _ = difference_ci({2: 20.0}, {1: 10.0, 2: 12.0, 3: 14.0})  # +8 < 9.94: within noise
    assert near.low < 0 < near.high and not near.excludes_zero


def test_paired_difference_by_hand():
    # per-seed differences 1.0, 1.2, 0.8: mean 1.0, sd 0.2, se 0.11547, ±0.49687 -> beyond noise
    row, base = {1: 6.0, 2: 6.4, 3: 5.8}, {1: 5.0, 2: 5.2, 3: 5.0}
    diff, method = difference_ci(row, base)
    assert method == "paired" and diff.mean == pytest.approx(1.0)
    assert diff.half_width == pytest.approx(T2 * 0.2 / math.sqrt(3), rel=1e-6)
    assert diff.excludes_zero
    # differences 1, -1, 0.3: the interval straddles zero
    noisy, _ = difference_ci({1: 6.0, 2: 4.0, 3: 5.3}, {1: 5.0, 2: 5.0, 3: 5.0})
    assert noisy.low < 0 < noisy.high and not noisy.excludes_zero


def test_welch_difference_by_hand():
    # a: 10, 12, 14 (var 4), b: 8, 9 (var 0.5). va = 4/3, vb = 0.25, se = sqrt(1.58333) = 1.25831
    # df = 1.58333^2 / ((4/3)^2/2 + 0.25^2/1) = 2.50694 / 0.95139 = 2.635 -> t(2), rounded down
    diff, method = difference_ci({1: 10.0, 2: 12.0, 3: 14.0}, {4: 8.0, 5: 9.0})
    assert method == "welch" and diff.mean == pytest.approx(3.5)
    assert diff.half_width == pytest.approx(T2 * math.sqrt(4 / 3 + 0.25), rel=1e-6)


def test_t_quantiles_p_values_and_sign_agreement():
    # the tables' values: t(1) 12.706, t(30) 2.042, t(200) 1.972 (1.96 is the normal's)
    assert t_quantile(1) == pytest.approx(12.7062, abs=1e-4) and t_quantile(2.9) == pytest.approx(T2, abs=1e-6)
    assert t_quantile(30) == pytest.approx(2.0423, abs=1e-4) and t_quantile(200) == pytest.approx(1.9719, abs=1e-4)
    assert math.isnan(t_quantile(0.5))
    # p is below 0.05 exactly when the interval mean ± t_quantile(df) * se excludes zero
    assert t_p_value(T2, 1.0, 2) == pytest.approx(0.05, abs=1e-6)
    assert t_p_value(1.01 * t_quantile(2), 1.0, 2) < 0.05 < t_p_value(0.99 * t_quantile(2), 1.0, 2)
    assert t_p_value(-3.0, 1.0, 2.9) == t_p_value(3.0, 1.0, 2)  # two-sided, df rounded down as the interval's
    assert t_p_value(1.0, 0.0, 2) == 0.0 and t_p_value(0.0, 0.0, 2) == 1.0 and math.isnan(t_p_value(1.0, 1.0, 0))
    assert sign_agrees(+0.4, +1.19) is True  # C1: both worse than base
    assert sign_agrees(-0.2, +0.83) is False
    assert sign_agrees(+0.5, -0.04) is None  # the paper's A3 vs base: below the 0.15 threshold
    assert sign_agrees(+0.5, None) is None
    assert sign_agrees(0.0, 0.5) is False
    assert sign_agrees(-1.0, -0.4, "bleu") is True and sign_agrees(-1.0, -0.2, "bleu") is None


def test_without_translations_bleus_test_is_the_seed_interval_and_says_beyond_noise_only_with_it():
    """One test for PPL and BLEU: with no dev translations stored, BLEU's interval is the seeds'
    alone, and 'BLEU beyond noise' reads it (a sentence bootstrap's p of 0.001 once sat beside this
    interval spanning zero). Values: the cpu table's base and C5, three seeds each."""
    import pandas as pd

    from ablations.spec import load_spec
    from reports.collect import Table3Data
    from reports.table3 import display_frame, table3_frame

    ppl = {"base": (24.29, 23.77, 24.40), "C5": (25.81, 25.87, 24.73)}
    bleu = {"base": (4.26, 4.65, 4.18), "C5": (2.87, 2.60, 3.83)}
    runs = pd.DataFrame([{"row": row, "group": row[0] if row != "base" else "base", "seed": seed,
                          "ppl": ppl[row][seed - 1], "bleu": bleu[row][seed - 1], "params": 1e6,
                          "train_time_s": 100.0, "tokens_per_s": 1.0, "steps": 10}
                         for row in ("base", "C5") for seed in (1, 2, 3)])
    data = Table3Data(study="s", storage="x", preset="cpu", spec=load_spec(), overrides=[], setup={}, runs=runs)
    frame = table3_frame(data)
    shown = display_frame(frame).set_index("row")
    # BLEU differences by seed -1.39, -2.05, -0.35: mean -1.2633, sd 0.85710, ±4.3027 * 0.85710 / √3 = ±2.1291
    # PPL differences 1.52, 2.10, 0.33: mean 1.3167, sd 0.90240, ±2.2416; the paper: C5 4.66 vs 4.92 PPL
    assert shown.loc["C5", "ΔBLEU [95% CI]"] == "-1.26 [-3.39, +0.87]"
    assert shown.loc["C5", "ΔPPL [95% CI] (paper)"] == "+1.32 [-0.92, +3.56] (-0.26)"  # -0.92494: 4.303 gave -0.93
    # t = 2.5273 (PPL) and -2.5529 (BLEU) on 2 df: p 0.1273 and 0.1253. Benjamini-Hochberg over the
    # two: the larger p stays, the smaller is raised to it (0.1253 * 2 / 1 > 0.1273): q 0.127 both
    assert frame.loc["C5", "ppl_p"] == pytest.approx(0.12734, abs=1e-4)
    assert frame.loc["C5", "bleu_p"] == pytest.approx(0.12525, abs=1e-4)
    assert frame.loc["C5", "ppl_q"] == frame.loc["C5", "bleu_q"] == pytest.approx(0.12734, abs=1e-4)
    assert shown.loc["C5", "PPL beyond noise"] == "no (q 0.127)" and shown.loc["C5", "BLEU beyond noise"] == "no (q 0.127)"
    assert pd.isna(frame.loc["C5", "bleu_sentence_se"])  # not measured, and not counted as zero


def test_a_table_in_progress_says_how_many_seeds_each_row_has_of_those_queued(tmp_path):
    """A real SQLite study: base with 3 complete seeds, C3 with 1 complete, 1 running and 1 waiting.
    The report reads 'seeds' 3 and '1 of 3', and says the table is in progress (4 of 6 runs)."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from ablations.spec import load_spec
    from foundation.schema import SCHEMA
    from reports.build import caveats, methods, summary
    from reports.collect import load_table3
    from reports.table3 import display_frame, table3_frame
    from ablations.record import KIND

    url = f"sqlite:///{tmp_path}/t3.db"
    study = optuna.create_study(study_name="t3", storage=url)
    for key, value in {"schema": SCHEMA, "kind": KIND, "preset": "cpu", "spec": load_spec()}.items():
        study.set_user_attr(key, value)
    for row, seed, ppl in (("base", 1, 24.0), ("base", 2, 25.0), ("base", 3, 26.0), ("C3", 1, 27.0)):
        study.add_trial(create_trial(state=TrialState.COMPLETE, value=ppl, user_attrs={
            "row": row, "seed": seed, "ppl": ppl, "bleu": 4.0, "params": 1e6, "train_time_s": 10.0,
            "tokens_per_s": 1.0, "steps": 10}))
    study.enqueue_trial({}, user_attrs={"row": "C3", "seed": 2})
    study.ask()  # C3 seed 2 running
    study.enqueue_trial({}, user_attrs={"row": "C3", "seed": 3})

    data = load_table3(url, "t3")
    frame = table3_frame(data)
    shown = display_frame(frame).set_index("row")
    assert shown.loc["base", "seeds"] == "3" and shown.loc["C3", "seeds"] == "1 of 3"
    assert shown.loc["C3", "PPL (paper)"] == "27.00 (4.88)"  # over the seed done
    assert caveats(data)[0].startswith("In progress: 4 of the 6 runs queued are complete")  # above the table
    assert not any(n.startswith("In progress") for n in methods(data, frame, 0) + [s for _, s in summary(frame)])


def _sentence_runs(rows, seeds=(1, 2), bleu=10.0):
    import pandas as pd

    return pd.DataFrame([{"row": row, "group": row[0] if row != "base" else "base", "seed": seed, "ppl": 20.0,
                          "bleu": bleu, "params": 1e6, "train_time_s": 1.0, "tokens_per_s": 1.0, "steps": 10,
                          "sacrebleu_signature": "sig", "device": "cpu"} for row in rows for seed in seeds])


REFS = [f"the house number {i} is small ." for i in range(40)]
GOOD = [f"the house number {i} is small ." for i in range(30)] + ["a dog ."] * 10
POOR = [f"house {i} ." for i in range(40)]


def test_the_sentence_level_uses_sacrebleus_statistics_is_seeded_and_only_widens_the_seed_interval():
    """Real sacreBLEU statistics on made-up dev translations: the resamples' mean BLEU is the corpus
    BLEU sacreBLEU prints; the same study gives the same draws; identical translations add no
    variance; different ones add some, so the interval of the one test contains the seeds' own."""
    from sacrebleu.metrics import BLEU

    from ablations.spec import load_spec
    from reports.collect import Table3Data
    from reports.seeds import difference_ci
    from reports.significance import by_row, difference, sentence_draws

    translations = {("base", 1): (GOOD, REFS), ("base", 2): (GOOD[::-1], REFS[::-1]), ("C5", 1): (POOR, REFS),
                    ("C5", 2): (GOOD, REFS), ("E", 1): (GOOD, REFS), ("E", 2): (GOOD[::-1], REFS[::-1])}
    data = Table3Data(study="s", storage="x", preset="cpu", spec=load_spec(), overrides=[], setup={},
                      runs=_sentence_runs(("base", "C5", "E")), translations=translations)
    draws = sentence_draws(data, 300)
    # base seed 2 and E seed 2 were scored on the dev set in another order: another dev set, left out
    assert set(draws) == {("base", 1), ("C5", 1), ("C5", 2), ("E", 1)}
    assert all(len(d) == 300 for d in draws.values())
    assert all((a == b).all() for a, b in zip(draws.values(), sentence_draws(data, 300).values()))
    corpus = BLEU(tokenize="13a").corpus_score(POOR, [REFS]).score
    assert abs(draws[("C5", 1)].mean() - corpus) < 0.1 * corpus + 1
    seeds = {1: 30.0, 2: 31.0, 3: 29.5}
    same = difference({s: v + 1.0 for s, v in seeds.items()}, seeds, {1: draws[("E", 1)]}, {1: draws[("base", 1)]})
    assert same.sentence_se is None  # not every seed has draws: not measured
    row_draws = {s: draws[("C5", 1)] for s in seeds}
    base_draws = {s: draws[("base", 1)] for s in seeds}
    test = difference({s: v + 1.0 for s, v in seeds.items()}, seeds, row_draws, base_draws)
    alone, _ = difference_ci({s: v + 1.0 for s, v in seeds.items()}, seeds)
    assert test.sentence_se > 0 and test.interval.low < alone.low and alone.high < test.interval.high
    zero = difference({s: v + 1.0 for s, v in seeds.items()}, seeds, base_draws, base_draws)
    assert zero.sentence_se == 0 and (zero.interval.low, zero.interval.high) == pytest.approx((alone.low, alone.high))
    assert by_row(draws, "C5").keys() == {1, 2}


def test_a_difference_within_seed_noise_is_never_beyond_noise_and_one_seed_each_claims_nothing():
    from reports.seeds import difference_ci
    from reports.significance import difference

    base = {1: 24.0, 2: 25.0, 3: 26.0}
    for shift in (0.0, 0.5, 1.0, 2.0, 3.0, 5.0):
        row = {1: 24.0 + shift, 2: 25.5 + shift, 3: 25.9 + shift}
        seeds, _ = difference_ci(row, base)
        if not seeds.excludes_zero:
            assert difference(row, base).beyond_noise is False
    assert difference({1: 30.0}, {1: 24.0}).beyond_noise is None  # one seed on both sides
    assert difference({1: 30.0}, base).method == "base noise"


def test_the_report_says_which_rows_lack_the_sentence_level():
    """A row whose runs, or base's, carry no dev translations of base's dev set is named; base
    without any leaves every row without it."""
    from ablations.spec import load_spec
    from reports.build import methods
    from reports.collect import Table3Data
    from reports.significance import missing_sentences, sentence_draws
    from reports.table3 import table3_frame

    def data(translations):
        return Table3Data(study="s", storage="x", preset="cpu", spec=load_spec(), overrides=[], setup={},
                          runs=_sentence_runs(("base", "C5", "C7", "E"), seeds=(1,)), translations=translations)

    some = data({("base", 1): (GOOD, REFS), ("C5", 1): (POOR, REFS), ("E", 1): (POOR, REFS[::-1])})
    draws = sentence_draws(some, 100)
    assert missing_sentences(some, draws).startswith("BLEU's sentence level is not measured for C7, E:")
    line = [n for n in methods(some, table3_frame(some, draws), 100, draws) if n.startswith("BLEU's sentence level")]
    assert line == [missing_sentences(some, draws) + "."]
    no_base = data({("C5", 1): (POOR, REFS)})
    assert sentence_draws(no_base, 100) == {}
    assert missing_sentences(no_base, {}).startswith("BLEU's sentence level is not measured for C5, C7, E:")
    everyone = data({(row, 1): (GOOD if row == "base" else POOR, REFS) for row in ("base", "C5", "C7", "E")})
    assert missing_sentences(everyone, sentence_draws(everyone, 100)) is None
    first = [n for n in methods(everyone, table3_frame(everyone), 100, {})]
    assert first[0].startswith("Beyond noise, for dev PPL and dev BLEU alike, means")
