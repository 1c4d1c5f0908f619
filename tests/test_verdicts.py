"""The one-sentence group verdicts count what the table's columns say."""

import numpy as np
import pandas as pd

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
    noise: still moving. The headline counts both, and C6's group verdict names it."""
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
    line = headline(frame)
    assert line.startswith("Beyond noise, 2 of the 2 rows differ from base in dev PPL (2 higher, 0 lower)")
    assert "in 1 of the 2 rows judged" in line and "for 1 of the 1 rows where the paper's difference is clear" in line  # C3's paper gap is too small
    assert "verdict still moving over the last part of training: C6" in group_verdict(frame, "C")
    # a row trained past base's last evaluation is not judged
    longer = _curves({"base": base, "C3": c3}, steps=(1200, 2400, 3600, 4800, 6000))
    longer = pd.concat([longer, pd.DataFrame([{"row": "C3", "seed": s, "step": 12000, "ppl": 20.0,
                                               "convergence": "converged"} for s in (1, 2, 3)])])
    frame = table3_frame(data)
    add_moving(frame, longer)
    assert pd.isna(frame.loc["C3", "verdict_moving"])
