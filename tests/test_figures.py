"""The report's figures keep an axis to the bulk of the rows when one lies far off (the cpu table's
D1 at +418% PPL against base flattened every other bar), and draw that row at the edge."""

import math

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.colors import to_hex

from reports.figures import (change_vs_base, change_vs_base_figure, group_colors, group_legend, kept_range, ppl_vs_time,
                             robust_limits, scatter_figure)

# the cpu table's changes against base, % (ours and the paper's, rows A1..big): D1 at +418
PPL_PCT = [3.0, -2.8, 5.0, 15.1, 11.0, 8.6, 23.1, 1.7, 13.7, 44.8, 7.3, 5.0, -1.1, 417.8, 17.1, 2.2, 7.3, -3.0,
           23.8, 7.5, 1.6, -0.2, 1.8, 4.9, 1.8, 24.2, 5.5, -0.8, 16.9, -5.3, 4.1, -3.5, 17.3, 0.6, -5.1, 11.2,
           0.0, -12.0]


def test_a_value_far_off_the_rest_is_left_out_of_the_axis_and_the_rest_kept():
    assert kept_range([0.0, *PPL_PCT]) == (-12.0, 44.8, 1, 0)  # D1 only: C4's +44.8 is not far off
    low, high = robust_limits([0.0, *PPL_PCT])
    assert low < -12.0 and 44.8 < high < 417.8
    # two together far off, above and below (at most a quarter of the values)
    assert kept_range([1, 2, 3, 4, 5, 6, 7, 8, -90, 300, 310, 2.5]) == (1, 8, 2, 1)
    assert kept_range([1, 2, 3, 4, 5, 1000, 2000, 3000]) == (1, 1000, 2, 0)  # 3 of 8 would be over a quarter


def test_a_spread_without_a_gap_keeps_the_axis_as_it_is():
    # the cpu table's BLEU changes reach -87% (big), but the others span -50..+23: not flattened
    assert robust_limits([0.0, -87.4, -50.3, -49.9, -41.1, 22.6, 18.7, 9.3, 2.2, -2.6]) is None
    assert robust_limits([0.48] * 10 + [1.64]) is None  # the others all alike: nothing to flatten
    assert robust_limits([math.nan, 1.0, 2.0]) is None and robust_limits([]) is None


def _frame(d1_ppl: float) -> pd.DataFrame:
    rows = ["base", "A1", "A2", "C1", "C2", "D1", "D2", "E"]
    ppl = [24.0, 24.9, 23.5, 29.7, 24.5, d1_ppl, 28.3, 23.4]
    frame = pd.DataFrame({"group": [r if r == "base" else r[0] for r in rows], "ppl": ppl, "ppl_ci": 0.5,
                          "train_time_s": [3600.0, 3300, 2700, 1500, 2200, 3300, 3700, 3500]}, index=rows)
    frame["d_ppl_pct"] = 100 * (frame["ppl"] - 24.0) / 24.0
    return frame


def test_the_axis_keeps_to_the_rest_however_far_off_a_row_is():
    """The limits around the other rows are the same whether D1 lies at 125 or 2,000 PPL; D1 in the
    bulk leaves the axis to scale itself. Each figure draws either way."""
    near, far, farther = _frame(27.0), _frame(125.0), _frame(2000.0)
    assert robust_limits(near["ppl"]) is None
    assert robust_limits(far["ppl"]) == robust_limits(farther["ppl"]) is not None
    assert robust_limits([0.0, *far["d_ppl_pct"]]) == robust_limits([0.0, *farther["d_ppl_pct"]]) is not None
    for draw in (change_vs_base, ppl_vs_time):
        pictures = {draw(f) for f in (near, far, farther)}
        assert len(pictures) == 3 and all(p.startswith(b"\x89PNG") for p in pictures)


def test_the_legend_names_each_groups_colour_as_the_points_are_drawn():
    """The legend lists each group once, in the order the rows give them, each in the colour its
    points and bars are drawn in; a group absent from the rows drawn (base in the change figure)
    is left out without shifting the others' colours."""
    groups = ["base", "normalisation", "normalisation", "feed-forward", "positions", "feed-forward"]
    fig, ax = plt.subplots()
    legend = group_legend(ax, groups)
    assert [t.get_text() for t in legend.get_texts()] == ["base", "normalisation", "feed-forward", "positions"]
    drawn = {h.get_label(): to_hex(h.get_color()) for h in legend.legend_handles}
    assert drawn == {g: to_hex(c) for g, c in group_colors(groups).items()}
    assert len(set(drawn.values())) == 4
    without_base = group_legend(ax, groups[1:])
    assert {h.get_label(): to_hex(h.get_color()) for h in without_base.legend_handles} == \
        {g: c for g, c in drawn.items() if g != "base"}
    plt.close(fig)


def _modifications_frame(with_paper: bool) -> pd.DataFrame:
    """The shipped modifications table's rows and groups, with its cpu report's changes (%)."""
    groups = {"base": "base", "pre_ln": "normalisation", "rmsnorm": "normalisation", "gelu": "feed-forward",
              "swiglu": "feed-forward", "geglu": "feed-forward", "learned": "positions", "rope": "positions",
              "tie_decoder": "embeddings", "untied": "embeddings", "unscaled": "embeddings",
              "gqa": "attention-heads", "mqa": "attention-heads", "modern": "modern"}
    ppl = [0.0, 4.3, -1.4, -3.4, -4.0, -2.6, -3.0, -13.5, 2.4, 3.8, 58.2, 20.8, 36.9, -9.1]
    bleu = [0.0, 15.7, 11.1, 16.5, 26.1, 13.7, 22.5, 44.3, 5.8, -1.3, -87.8, -52.4, -79.0, 29.1]
    frame = pd.DataFrame({"group": list(groups.values()), "d_ppl_pct": ppl, "d_bleu_pct": bleu}, index=list(groups))
    if with_paper:  # a paper column of the same size: the second legend and hatched bars
        frame["paper_ppl"], frame["d_paper_ppl_pct"], frame["d_paper_bleu_pct"] = 4.9, ppl, bleu
    return frame


def test_the_change_figure_keeps_its_row_names_and_legends_clear_of_each_other_and_the_bars():
    """With the modifications' long row names (tie_decoder, unscaled), no two names overlap on the
    axis, and neither legend covers a bar (the cpu report's legend once hid modern's BLEU bar)."""
    for with_paper in (False, True):
        fig = change_vs_base_figure(_modifications_frame(with_paper))
        renderer = fig.canvas.get_renderer()
        fig.draw(renderer)
        top, bottom = fig.axes
        names = [t for t in bottom.get_xticklabels() if t.get_text()]
        assert [t.get_text() for t in names][:3] == ["pre_ln", "rmsnorm", "gelu"]
        boxes = [t.get_window_extent(renderer) for t in names]
        assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:]))
        legends = [ax.get_legend() for ax in (top, bottom) if ax.get_legend() is not None]
        assert len(legends) == (2 if with_paper else 1)
        bars = [p.get_window_extent(renderer) for ax in (top, bottom) for p in ax.patches]
        assert len(bars) == 13 * 2 * (2 if with_paper else 1)
        for legend in legends:
            box = legend.get_window_extent(renderer)
            assert not any(box.overlaps(bar) for bar in bars)
        plt.close(fig)


def test_the_labels_of_rows_drawn_at_one_edge_do_not_cover_each_other():
    """The cpu modifications report's BLEU: gqa, mqa and unscaled lie far below the rest and are
    drawn at the bottom edge, two of them at nearly one model size; each label stays readable."""
    frame = _modifications_frame(with_paper=False)
    frame["bleu"] = [3.95, 4.58, 4.39, 4.60, 4.98, 4.50, 4.85, 5.70, 4.18, 3.90, 0.48, 1.88, 0.83, 5.10]
    frame["bleu_ci"] = 0.5
    frame["params_m"] = [0.478, 0.478, 0.477, 0.478, 0.479, 0.479, 0.511, 0.478, 0.606, 0.734, 0.478, 0.422,
                         0.413, 0.478]
    fig = scatter_figure(frame, "params_m", "bleu", "bleu_ci", "parameters", "BLEU", "t")
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    labels = {t.get_text(): t.get_window_extent(renderer) for t in fig.axes[0].texts}
    assert {"unscaled: 0.48", "gqa: 1.88", "mqa: 0.83"} <= set(labels)  # each with its value beside it
    at_edge = [labels[name] for name in ("unscaled: 0.48", "gqa: 1.88", "mqa: 0.83")]
    assert not any(a.overlaps(b) for i, a in enumerate(at_edge) for b in at_edge[i + 1:])
    plt.close(fig)


def test_the_change_figure_always_shows_zero_where_its_bars_start():
    """Three rows all 21-29% below base, and one far above two others: the axis keeps zero in view
    (zero once counted as a value the rule could leave out, and the bars hung from the top edge)."""
    frame = pd.DataFrame({"group": ["base", "normalisation", "feed-forward", "positions"],
                          "d_ppl_pct": [0.0, -29.3, -22.5, -21.7], "d_bleu_pct": [0.0, 48.8, 53.5, 135.0]},
                         index=["base", "pre_ln", "swiglu", "rope"])
    fig = change_vs_base_figure(frame)
    for ax, values in zip(fig.axes, (frame["d_ppl_pct"], frame["d_bleu_pct"])):
        low, high = ax.get_ylim()
        assert low <= 0.0 <= high and low <= values.min() and values.max() <= high  # every bar whole
    plt.close(fig)
    fig = change_vs_base_figure(_frame(2000.0).assign(d_bleu_pct=0.0))  # D1 far off: cut, zero still in view
    low, high = fig.axes[0].get_ylim()
    assert low <= 0.0 < high < 100
    plt.close(fig)
