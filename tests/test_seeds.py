"""Seed statistics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from reports.seeds import difference_ci, mean_ci, sign_agrees, t_quantile


def test_mean_ci_three_seeds_by_hand():
    # values 10, 12, 14: mean 12, sample sd 2, se 2/sqrt(3) = 1.1547, t(2) = 4.303 -> ±4.9687
    ci = mean_ci([10.0, 12.0, 14.0])
    assert ci.mean == 12.0 and ci.n == 3
    assert ci.half_width == pytest.approx(4.303 * 2 / math.sqrt(3), rel=1e-9)
    assert ci.low == pytest.approx(12 - 4.96867, abs=1e-4) and ci.high == pytest.approx(16.96867, abs=1e-4)
    assert ci.excludes_zero


def test_one_seed_has_no_interval_and_claims_nothing():
    ci = mean_ci([5.0])
    assert ci.mean == 5.0 and math.isnan(ci.low) and not ci.excludes_zero
    diff, _ = difference_ci({1: 5.0}, {1: 4.0})
    assert diff.mean == 1.0 and not diff.excludes_zero


def test_one_seed_row_against_base_seeds_uses_base_noise_by_hand():
    # base 10, 12, 14: mean 12, sd 2; a new run's 95% prediction half-width is
    # t(2) * 2 * sqrt(1 + 1/3) = 4.303 * 2.3094 = 9.9373
    diff, method = difference_ci({1: 23.0}, {1: 10.0, 2: 12.0, 3: 14.0})
    assert method == "base noise" and diff.mean == pytest.approx(11.0) and diff.n == 1
    assert diff.half_width == pytest.approx(4.303 * 2 * math.sqrt(4 / 3), rel=1e-9)
    assert diff.low == pytest.approx(11.0 - 9.93727, abs=1e-4) and diff.excludes_zero
    near, _ = difference_ci({2: 20.0}, {1: 10.0, 2: 12.0, 3: 14.0})  # +8 < 9.94: within noise
    assert near.low < 0 < near.high and not near.excludes_zero


def test_paired_difference_by_hand():
    # per-seed differences 1.0, 1.2, 0.8: mean 1.0, sd 0.2, se 0.11547, ±0.49687 -> beyond noise
    row, base = {1: 6.0, 2: 6.4, 3: 5.8}, {1: 5.0, 2: 5.2, 3: 5.0}
    diff, method = difference_ci(row, base)
    assert method == "paired" and diff.mean == pytest.approx(1.0)
    assert diff.half_width == pytest.approx(4.303 * 0.2 / math.sqrt(3), rel=1e-6)
    assert diff.excludes_zero
    # differences 1, -1, 0.3: the interval straddles zero
    noisy, _ = difference_ci({1: 6.0, 2: 4.0, 3: 5.3}, {1: 5.0, 2: 5.0, 3: 5.0})
    assert noisy.low < 0 < noisy.high and not noisy.excludes_zero


def test_welch_difference_by_hand():
    # a: 10, 12, 14 (var 4), b: 8, 9 (var 0.5). va = 4/3, vb = 0.25, se = sqrt(1.58333) = 1.25831
    # df = 1.58333^2 / ((4/3)^2/2 + 0.25^2/1) = 2.50694 / 0.95139 = 2.635 -> t(2) = 4.303
    diff, method = difference_ci({1: 10.0, 2: 12.0, 3: 14.0}, {4: 8.0, 5: 9.0})
    assert method == "welch" and diff.mean == pytest.approx(3.5)
    assert diff.half_width == pytest.approx(4.303 * math.sqrt(4 / 3 + 0.25), rel=1e-6)


def test_t_quantiles_and_sign_agreement():
    assert t_quantile(1) == 12.706 and t_quantile(2.9) == 4.303 and t_quantile(200) == 1.96
    assert math.isnan(t_quantile(0.5))
    assert sign_agrees(+0.4, +1.19) is True  # C1: both worse than base
    assert sign_agrees(-0.2, +0.83) is False
    assert sign_agrees(+0.5, -0.04) is None  # the paper's A3 vs base: below the 0.15 threshold
    assert sign_agrees(+0.5, None) is None
    assert sign_agrees(0.0, 0.5) is False
    assert sign_agrees(-1.0, -0.4, "bleu") is True and sign_agrees(-1.0, -0.2, "bleu") is None


def test_report_table_shows_bleus_seed_interval_beside_its_bootstrap_p():
    """A sentence-bootstrap p of 0.001 must not read as 'beyond noise' when the seeds disagree:
    ΔBLEU carries its own seed interval. Values: the cpu table's base and C5, three seeds each."""
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
    shown = display_frame(table3_frame(data, {"C5": 0.001})).set_index("row")
    # BLEU differences by seed -1.39, -2.05, -0.35: mean -1.2633, sd 0.85710, ±4.303 * 0.85710 / √3 = ±2.1292
    # PPL differences 1.52, 2.10, 0.33: mean 1.3167, sd 0.90240, ±2.2417; the paper: C5 4.66 vs 4.92 PPL
    assert shown.loc["C5", "ΔBLEU [95% CI]"] == "-1.26 [-3.39, +0.87]"
    assert shown.loc["C5", "ΔPPL [95% CI] (paper)"] == "+1.32 [-0.93, +3.56] (-0.26)"
    assert shown.loc["C5", "beyond noise"] == "no" and shown.loc["C5", "p vs base"] == "0.001"


def test_a_table_in_progress_says_how_many_seeds_each_row_has_of_those_queued(tmp_path):
    """A real SQLite study: base with 3 complete seeds, C3 with 1 complete, 1 running and 1 waiting.
    The report reads 'seeds' 3 and '1 of 3', and says the table is in progress (4 of 6 runs)."""
    import optuna
    from optuna.trial import TrialState, create_trial

    from ablations.spec import load_spec
    from reports.build import caveats, methods, summary
    from reports.collect import load_table3
    from reports.table3 import display_frame, table3_frame
    from sweeps.table3 import KIND

    url = f"sqlite:///{tmp_path}/t3.db"
    study = optuna.create_study(study_name="t3", storage=url)
    for key, value in {"kind": KIND, "preset": "cpu", "spec": load_spec()}.items():
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


def test_the_report_says_why_a_p_vs_base_is_missing():
    """Real sacreBLEU bootstraps on made-up dev translations: a row paired with base gets a p; a
    row without translations, or with them only for a seed base lacks, is named; base without
    any leaves every row empty, and the note says that instead."""
    import pandas as pd

    from ablations.spec import load_spec
    from reports.build import methods
    from reports.collect import Table3Data
    from reports.significance import missing_p, paired_bootstrap
    from reports.table3 import table3_frame

    refs = [f"the house number {i} is small ." for i in range(40)]
    good = [f"the house number {i} is small ." for i in range(30)] + ["a dog ."] * 10
    poor = [f"house {i} ." for i in range(40)]
    runs = pd.DataFrame([{"row": row, "group": row[0] if row != "base" else "base", "seed": seed, "ppl": 20.0,
                          "bleu": 10.0, "params": 1e6, "train_time_s": 1.0, "tokens_per_s": 1.0, "steps": 10,
                          "sacrebleu_signature": "sig", "device": "cpu"}
                         for row in ("base", "C5", "C7", "E") for seed in (1, 2)])

    def data(translations):
        return Table3Data(study="s", storage="x", preset="cpu", spec=load_spec(), overrides=[], setup={},
                          runs=runs, translations=translations)

    paired = data({("base", 1): (good, refs), ("C5", 1): (poor, refs), ("E", 2): (poor, refs)})
    p_values = paired_bootstrap(paired, 200)
    assert set(p_values) == {"C5"} and p_values["C5"] < 0.05  # E's seed 2 has no base translation
    assert missing_p(paired, p_values) == ("p vs base is empty for C7, E: none of their runs carries dev "
                                           "translations of a seed base has them for (1), or of the same dev set")
    line = [n for n in methods(paired, table3_frame(paired, p_values), 200) if n.startswith("p vs base is empty")]
    assert line == [missing_p(paired, p_values) + "."]
    no_base = data({("C5", 1): (poor, refs)})
    assert paired_bootstrap(no_base, 200) == {}
    assert missing_p(no_base, {}).startswith("p vs base is empty: base's runs carry no dev translations")
    everyone = data({(row, 1): (good if row == "base" else poor, refs) for row in ("base", "C5", "C7", "E")})
    assert missing_p(everyone, paired_bootstrap(everyone, 200)) is None


def test_a_row_scoring_exactly_base_bleu_has_p_1_not_sacrebleus_floor():
    """Identical translations, or both at BLEU 0 (a smoke-scale run): sacreBLEU's bootstrap
    prints 1/(n+1), its smallest p, as if the rows differed; the report says p = 1. A row that
    does differ keeps sacreBLEU's own p."""
    import pandas as pd
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from ablations.spec import load_spec
    from reports.collect import Table3Data
    from reports.significance import paired_bootstrap

    refs = [f"the house number {i} is small ." for i in range(40)]
    good = [f"the house number {i} is small ." for i in range(30)] + ["a dog ."] * 10
    poor = [f"house {i} ." for i in range(40)]
    nothing, other_nothing = ["zzz"] * 40, ["qqq ."] * 40  # BLEU 0 both
    runs = pd.DataFrame([{"row": row, "group": row[0] if row != "base" else "base", "seed": 1, "ppl": 20.0,
                          "bleu": 0.0, "params": 1e6, "train_time_s": 1.0, "tokens_per_s": 1.0, "steps": 10,
                          "sacrebleu_signature": "sig", "device": "cpu"} for row in ("base", "A1", "C5")])

    def p_of(base_hyp, row_hyp):
        sacre = PairedTest([("base", base_hyp), ("A1", row_hyp)], {"BLEU": BLEU(tokenize="13a")}, [refs],
                           test_type="bs", n_samples=200)()[1]["BLEU"][1].p_value
        ours = paired_bootstrap(Table3Data(study="s", storage="x", preset="cpu", spec=load_spec(), overrides=[],
                                           setup={}, runs=runs,
                                           translations={("base", 1): (base_hyp, refs), ("A1", 1): (row_hyp, refs)}),
                                200)["A1"]
        return sacre, ours

    assert p_of(good, good) == (pytest.approx(1 / 201), 1.0)
    assert p_of(nothing, other_nothing) == (pytest.approx(1 / 201), 1.0)
    sacre, ours = p_of(good, poor)
    assert ours == sacre < 0.05
