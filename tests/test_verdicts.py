"""The one-sentence group verdicts count what the table's columns say."""

import numpy as np
import pandas as pd

from reports.seeds import sign_agrees
from reports.verdicts import group_verdict


def test_sign_agreement_is_counted_over_the_table_s_column():
    # the table fills 'ppl_sign_agrees' row by row from numpy differences, as here; a numpy
    # boolean there would add as a logical or (True + True is True)
    assert sign_agrees(np.float64(1.19), np.float64(0.20)) is True
    frame = pd.DataFrame({"group": ["C"] * 4, "d_ppl": [3.29, 1.32, 1.19, -0.37],
                          "d_paper_ppl": [-0.04, -0.26, 0.20, -0.17],
                          "beyond_noise": [True, False, True, False]},
                         index=["C3", "C5", "C6", "C7"])
    frame["ppl_sign_agrees"] = None
    for row in frame.index:
        frame.loc[row, "ppl_sign_agrees"] = sign_agrees(frame.loc[row, "d_ppl"], frame.loc[row, "d_paper_ppl"])
    assert frame["ppl_sign_agrees"].dropna().tolist() == [False, True, True]  # C3's paper gap is too small
    sentence = group_verdict(frame, "C")
    assert "signs agree with the paper for 2 of 3 rows" in sentence
    # each row's paper difference and sign in its own parentheses, so the list reads unambiguously
    assert "beyond seed noise: C3 +3.29 PPL (paper -0.04), C6 +1.19 PPL (paper +0.20, same sign)" in sentence


def test_a_group_of_your_own_is_named_once_and_a_papers_group_with_its_topic():
    frame = pd.DataFrame({"group": ["X", "X", "A"], "d_ppl": [-7.0, 41.7, 0.5], "d_paper_ppl": [np.nan, np.nan, 0.37],
                          "d_ppl_low": [-110.0, -151.6, -0.5], "beyond_noise": [False, False, False],
                          "ppl_sign_agrees": [None, None, True]},
                         index=["X1", "X2", "A1"])
    assert group_verdict(frame, "X") == "X: within seed noise: X1, X2."
    assert group_verdict(frame, "A").startswith("A, number of heads at constant compute: within seed noise: A1;")
