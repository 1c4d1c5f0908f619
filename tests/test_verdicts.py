"""The one-sentence group verdicts count what the table's columns say."""

import numpy as np
import pandas as pd
import pytest

from ablations.spec import load_spec
from reports.collect import Table3Data
from reports.seeds import sign_agrees
from reports.table3 import table3_frame
from reports.verdicts import group_verdict


def _table(differences: dict[str, list[float]]) -> Table3Data:
    """A table of base and the given rows of Table 3 (the paper's values from its spec), three seeds
    each: base at 24.0, 24.1, 23.9 dev PPL, each row that plus its difference for that seed."""
    base = [24.0, 24.1, 23.9]
    runs = pd.DataFrame.from_records(
        {"row": row, "seed": seed, "ppl": b + d, "bleu": 4.0, "params": 480_000, "train_time_s": 3600.0,
         "tokens_per_s": 900.0, "steps": 24_000}
        for row, diffs in {"base": [0.0, 0.0, 0.0], **differences}.items()
        for seed, b, d in zip((1, 2, 3), base, diffs))
    spec = load_spec()
    return Table3Data(study="t", storage="sqlite://", preset="cpu", overrides=[], setup={}, runs=runs,
                      spec={row: spec[row] for row in ("base", *differences)})


def test_sign_agreement_is_counted_over_the_table_s_column():
    # the table fills 'ppl_sign_agrees' row by row from numpy differences; a numpy boolean there
    # would add as a logical or (True + True is True)
    assert sign_agrees(np.float64(1.19), np.float64(0.20)) is True
    frame = table3_frame(_table({"C3": [3.28, 3.29, 3.30], "C5": [-2.0, 1.32, 4.64],
                                 "C6": [1.18, 1.19, 1.20], "C7": [-3.0, -0.37, 2.26]}))
    assert frame["d_ppl"].round(2).tolist() == [0.0, 3.29, 1.32, 1.19, -0.37]
    assert frame["d_paper_ppl"].round(2).tolist() == [0.0, -0.04, -0.26, 0.20, -0.17]
    assert frame["beyond_noise"].tolist()[1:] == [True, False, True, False]
    assert frame["ppl_sign_agrees"].dropna().tolist() == [False, True, True]  # C3's paper gap is too small
    sentence = group_verdict(frame, "C")
    assert "signs agree with the paper for 2 of 3 rows" in sentence
    # each row's paper difference and sign in its own parentheses, so the list reads unambiguously
    c3, c6 = (f"[{frame.loc[r, 'd_ppl_low']:+.2f}, {frame.loc[r, 'd_ppl_high']:+.2f}]" for r in ("C3", "C6"))
    assert (f"beyond noise: C3 +3.29 PPL {c3} (paper -0.04), C6 +1.19 PPL {c6} (paper +0.20, same sign)"
            in sentence)


def test_a_group_of_your_own_is_named_once_and_a_papers_group_with_its_topic():
    frame = pd.DataFrame({"group": ["X", "X", "A"], "d_ppl": [-7.0, 41.7, 0.5], "d_paper_ppl": [np.nan, np.nan, 0.37],
                          "d_ppl_low": [-110.0, -151.6, -0.5], "beyond_noise": [False, False, False],
                          "ppl_sign_agrees": [None, None, True]},
                         index=["X1", "X2", "A1"])
    assert group_verdict(frame, "X") == "X: within noise: X1, X2."
    assert group_verdict(frame, "A").startswith("A, number of heads at constant compute: within noise: A1;")


def test_a_table_without_the_papers_numbers_ranks_nothing_against_them():
    """The report opens with a rank correlation against the paper's only where the spec has the
    paper's numbers (ablations/modifications.yaml has none)."""
    from reports.build import summary

    data = _table({"C3": [3.28, 3.29, 3.30]})
    assert any(kind == "rank correlation" for kind, _ in summary(table3_frame(data)))
    for row in data.spec.values():
        row.pop("paper", None)
    kinds = [kind for kind, _ in summary(table3_frame(data))]
    assert "rank correlation" not in kinds and any(kind.startswith("verdict") for kind in kinds)


def test_a_row_without_an_interval_is_not_called_within_noise_and_the_reason_is_named():
    """A row has no interval with one seed on both sides, or while base has one seed (a table in
    progress): it is listed apart from the rows within seed noise, with which side lacks seeds."""
    data = _table({"C3": [0.05, -0.05, 0.02], "C6": [1.0, 1.1, 1.2]})
    data.runs = data.runs[~((data.runs["row"] == "C6") & (data.runs["seed"] > 1))]  # C6: seed 1 alone
    frame = table3_frame(data)
    assert frame.loc["C3", "beyond_noise"] == False and not np.isnan(frame.loc["C6", "d_ppl_low"])  # noqa: E712
    data.runs = data.runs[~((data.runs["row"] == "base") & (data.runs["seed"] > 1))]  # base: seed 1 alone
    frame = table3_frame(data)
    sentence = group_verdict(frame, "C")
    assert "no interval (base has one seed): C3, C6" in sentence and "within noise" not in sentence
    both = table3_frame(_table({"C3": [0.05, -0.05, 0.02]}))
    assert "within noise: C3" in group_verdict(both, "C")


def _curves(rows: dict[str, list[list[float]]], steps=(1200, 2400, 3600, 4800, 6000)) -> pd.DataFrame:
    """Dev PPL curves: per row, per seed, one value per step."""
    return pd.DataFrame([{"row": row, "seed": seed, "step": step, "ppl": ppl, "convergence": "converged"}
                         for row, seeds in rows.items() for seed, values in enumerate(seeds, 1)
                         for step, ppl in zip(steps, values)])


def test_the_headline_counts_the_table_and_the_verdicts_still_moving():
    """C3 worse beyond noise all along; C6 beyond noise until its last evaluation, then within
    noise: still moving, and late. The headline counts both, and C6's group verdict names it."""
    from reports.trajectory import add_moving, paired_curves, still_moving
    from reports.verdicts import headline

    data = _table({"C3": [3.28, 3.29, 3.30], "C6": [1.18, 1.19, 1.20]})
    base = [[30.0, 27.0, 25.0, 24.5, 24.0], [30.1, 27.1, 25.1, 24.6, 24.1], [29.9, 26.9, 24.9, 24.4, 23.9]]
    c3 = [[v + 3.3 for v in seed] for seed in base]
    c6 = [[v + d for v, d in zip(seed, (2.0, 2.0, 2.0, 2.0, 0.0 + s))] for seed, s in zip(base, (-0.5, 0.6, 0.1))]
    data.curves = _curves({"base": base, "C3": c3, "C6": c6})
    frame = table3_frame(data)
    assert paired_curves(data.curves, "C6")["verdict"].tolist() == [1, 1, 1, 1, 0]
    assert still_moving(paired_curves(data.curves, "C3")) is False and frame.loc["C3", "verdict_moving"] == False  # noqa: E712
    assert frame.loc["C6", "verdict_moving"] == True  # noqa: E712
    assert frame.loc["C3", "verdict_since_step"] == 1200 and frame.loc["C3", "verdict_late"] == False  # noqa: E712
    assert frame.loc["C6", "verdict_since_step"] == 6000 and frame.loc["C6", "verdict_late"] == True  # noqa: E712
    line = headline(frame)
    assert line.startswith("Beyond noise, 2 of the 2 rows differ from base in dev PPL (2 higher, 0 lower; 1 of these "
                           "verdicts late)")
    assert ("the PPL verdict was reached late (held for less than 50% of training) in 1 of the 2 rows judged, "
            "and is still moving over the last 20% of evaluations in 1") in line
    assert "for 1 of the 1 rows where the paper's difference is clear" in line  # C3's paper gap is too small
    assert ("late PPL verdict (held for less than 50% of training): C6 since step 6,000 (100%, still moving over "
            "the last part of training)") in group_verdict(frame, "C")
    # a row trained past base's last evaluation is not judged
    longer = _curves({"base": base, "C3": c3}, steps=(1200, 2400, 3600, 4800, 6000))
    longer = pd.concat([longer, pd.DataFrame([{"row": "C3", "seed": s, "step": 12000, "ppl": 20.0,
                                               "convergence": "converged"} for s in (1, 2, 3)])])
    frame = table3_frame(data)
    add_moving(frame, longer)
    assert pd.isna(frame.loc["C3", "verdict_moving"]) and pd.isna(frame.loc["C3", "verdict_since_step"])


def test_a_verdict_reached_at_nine_tenths_of_training_is_late_though_not_still_moving():
    """Ten evaluations (the last 20%: two). C3 within noise until 90% of training, beyond noise at
    the last two: its verdict has not changed over the last 20% (not still moving), but it has
    held for a tenth of training: late, in the table, the group sentence and the headline's
    count. C6 beyond noise from 40% on: held for 60%, not late. Evaluations a step or two off
    base's grid (a resumed run) are aligned, as the still-moving rule's are."""
    from reports.table3 import display_frame
    from reports.verdicts import headline

    steps = tuple(range(1200, 12001, 1200))
    data = _table({"C3": [3.28, 3.29, 3.30], "C6": [1.18, 1.19, 1.20]})
    base = [[30.0 - 0.5 * i + 0.1 * s for i in range(10)] for s in (0, 1, -1)]
    c3 = [[v + (3.3 if i >= 8 else 0.05 * (1 - s)) for i, v in enumerate(seed)] for s, seed in enumerate(base)]
    c6 = [[v + (1.2 if i >= 3 else (-1) ** s * 2.0) for i, v in enumerate(seed)] for s, seed in enumerate(base)]
    data.curves = _curves({"base": base, "C3": c3, "C6": c6}, steps=steps)
    data.curves.loc[(data.curves["row"] == "C6") & (data.curves["seed"] == 2), "step"] -= 2  # resumed: one step off
    frame = table3_frame(data)
    assert frame.loc["C3", "verdict_moving"] == False and frame.loc["C3", "verdict_late"] == True  # noqa: E712
    assert (frame.loc["C3", "verdict_since_step"], frame.loc["C3", "verdict_since_share"]) == (10800, 0.9)
    assert frame.loc["C6", "verdict_since_step"] == 4800 and frame.loc["C6", "verdict_late"] == False  # noqa: E712
    shown = display_frame(frame).set_index("row")
    assert shown.loc["C3", "PPL verdict since"] == "90% (late)" and shown.loc["C6", "PPL verdict since"] == "40%"
    assert "late PPL verdict (held for less than 50% of training): C3 since step 10,800 (90%)" in group_verdict(frame, "C")
    line = headline(frame)
    assert "dev PPL (2 higher, 0 lower; 1 of these verdicts late)" in line
    assert "reached late (held for less than 50% of training) in 1 of the 2 rows judged" in line
    assert "still moving over the last 20% of evaluations in 0" in line


def test_multiple_comparisons_are_corrected_over_every_row_and_metric_by_benjamini_hochberg():
    """The family is every row x metric with a p-value (base and rows without an interval left
    out); q is Benjamini-Hochberg's adjusted p, by hand: sorted p_(i) * m / i, then the running
    minimum from the largest down. A row beyond noise by its own interval but with q >= 0.05 is
    named in its group's sentence, and the headline counts both."""
    from reports.significance import add_corrected, corrected, family_size
    from reports.verdicts import headline

    frame = pd.DataFrame({"group": ["base", "C", "C", "C"], "d_ppl": [0.0, 3.0, 1.0, 0.2],
                          "d_bleu": [0.0, -1.0, 0.1, 0.0], "d_ppl_low": [0.0, 2.0, 0.1, -0.5],
                          "d_ppl_high": [0.0, 4.0, 1.9, 0.9], "d_bleu_low": [0.0, -1.9, -0.5, np.nan],
                          "d_bleu_high": [0.0, -0.1, 0.7, np.nan],
                          "beyond_noise": [None, True, True, False], "bleu_beyond_noise": [None, True, False, None],
                          "ppl_p": [np.nan, 0.001, 0.04, 0.6], "bleu_p": [np.nan, 0.03, 0.5, np.nan],
                          "ppl_sign_agrees": [None, None, None, None]}, index=["base", "C3", "C6", "C7"])
    add_corrected(frame)
    assert family_size(frame) == 5  # C7's BLEU has no interval
    # sorted p: 0.001, 0.03, 0.04, 0.5, 0.6 -> x 5/i: 0.005, 0.075, 0.0667, 0.625, 0.6 -> running min from the top
    assert frame["ppl_q"].tolist()[1:] == pytest.approx([0.005, 0.0667, 0.6], abs=1e-4)
    assert frame["bleu_q"].tolist()[1:3] == pytest.approx([0.0667, 0.6], abs=1e-4) and pd.isna(frame.loc["C7", "bleu_q"])
    assert corrected(frame, "ppl").tolist() == [False, True, False, False]
    assert "not beyond noise after correcting for the 5 comparisons (Benjamini–Hochberg, q < 0.05): C6 PPL, C3 BLEU" \
        in group_verdict(frame, "C")
    line = headline(frame)
    assert line.startswith("Beyond noise, 2 of the 3 rows differ from base in dev PPL (2 higher, 0 lower) and 1 in dev "
                           "BLEU (0 higher, 1 lower), each comparison by its own 95% interval; after correcting for all "
                           "5 comparisons (Benjamini–Hochberg, q < 0.05), 1 in dev PPL and 0 in dev BLEU")


def test_sign_agreement_is_printed_beside_every_change_hurts_and_random_signs():
    """Of 12 clear rows, the paper found 8 worse than base and 4 better; ours are worse in all
    but one: 9 agree (8 of 8, 1 of 4). A table where every change is worse than base scores 8;
    random signs reach 9 of 12 with p = (220 + 66 + 12 + 1) / 4096 = 0.073. With one more row of
    ours worse, agreement falls to the baseline and the headline says ours does not beat it."""
    from reports.agreement import signs
    from reports.verdicts import headline

    paper = [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, -0.2, -0.3, -0.4, -0.5]
    ours = [1.0] * 8 + [-1.0, 1.0, 1.0, 1.0]
    rows = [f"r{i}" for i in range(12)]
    frame = pd.DataFrame({"group": ["base", *["X"] * 12], "d_ppl": [0.0, *ours], "d_paper_ppl": [0.0, *paper],
                          "beyond_noise": [None, *[True] * 12]}, index=["base", *rows])
    frame["ppl_sign_agrees"] = [None, *(sign_agrees(o, p) for o, p in zip(ours, paper))]
    agreement = signs(frame)
    assert (agreement.agree, agreement.rows, agreement.worse_agree, agreement.worse, agreement.better_agree,
            agreement.better, agreement.every_change_hurts) == (9, 12, 8, 8, 1, 4, 8)
    assert agreement.p_random == pytest.approx(299 / 4096)
    line = headline(frame)
    assert ("our PPL change has the paper's sign for 9 of the 12 rows where the paper's difference is clear (8 of the "
            "8 it found worse than base, 1 of the 4 it found better); a table where every change is worse than base "
            "scores 8 of 12, so ours beats it by 1 row; random signs reach 9 or more with p = 0.073") in line
    frame.loc["r8", "d_ppl"], frame.loc["r8", "ppl_sign_agrees"] = 1.0, False
    assert "scores 8 of 12, so ours does not beat it; random signs reach 8 or more with p = 0.194" in headline(frame)


def test_spearman_has_a_seeded_one_sided_permutation_p():
    """rho is scipy's Spearman (ties at their average rank); its p is how often a random pairing
    reaches it: about 1/120 for five rows in the paper's order (the one pairing of 5! that does),
    near 1 for the reverse order, and the same p on every call (seeded)."""
    from reports.agreement import spearman

    frame = pd.DataFrame({"ppl": [1.0, 2.0, 3.0, 4.0, 5.0], "paper_ppl": [10.0, 20.0, 30.0, 40.0, 50.0]})
    same = spearman(frame, "ppl", "paper_ppl")
    assert same.rho == pytest.approx(1.0) and same.rows == 5 and same.p == pytest.approx(1 / 120, abs=0.004)
    assert spearman(frame, "ppl", "paper_ppl") == same
    reverse = spearman(frame.assign(ppl=frame["ppl"][::-1].to_numpy()), "ppl", "paper_ppl")
    assert reverse.rho == pytest.approx(-1.0) and reverse.p > 0.99
    assert same.text() == f"+1.000 over 5 rows (permutation p = {same.p:.3f})"
    assert spearman(frame.iloc[:2], "ppl", "paper_ppl").text() == "n/a over 2 rows"
