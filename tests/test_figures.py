"""The report's figures keep an axis to the bulk of the rows when one lies far off (the cpu table's
D1 at +418% PPL against base flattened every other bar), and draw that row at the edge."""

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.colors import to_hex
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from reports.figures import (FIGURES, change_vs_base_figure, figures, group_colors, group_legend, kept_range, png,
                             ppl_vs_time_figure, robust_limits, scatter_figure, verdict_curves)

REPO = Path(__file__).resolve().parent.parent

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
    for draw in (change_vs_base_figure, ppl_vs_time_figure):
        pictures = {png(draw(f)) for f in (near, far, farther)}
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
        assert len(legends) == 2  # which bar is whose (and the interval, the linear band); the groups
        bars = [p.get_window_extent(renderer) for ax in (top, bottom) for c in ax.containers
                if isinstance(c, BarContainer) for p in c.patches]
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


def test_the_change_figure_draws_every_bar_whole_with_zero_in_view():
    """Three rows all 21-29% below base, and one (D1) 8,000% above the rest: no bar is cut, zero
    stays in view, and the axis is symmetric-logarithmic so the small bars stay readable."""
    frame = pd.DataFrame({"group": ["base", "normalisation", "feed-forward", "positions"],
                          "d_ppl_pct": [0.0, -29.3, -22.5, -21.7], "d_bleu_pct": [0.0, 48.8, 53.5, 135.0]},
                         index=["base", "pre_ln", "swiglu", "rope"])
    for frame in (frame, _frame(2000.0).assign(d_bleu_pct=0.0)):
        fig = change_vs_base_figure(frame)
        for ax, values in zip(fig.axes, (frame["d_ppl_pct"], frame["d_bleu_pct"])):
            low, high = ax.get_ylim()
            assert low <= 0.0 <= high and low < values.min() and values.max() < high  # every bar whole
            assert ax.get_yscale() == "symlog"
            assert not [t for t in ax.texts if t.get_text().endswith("%")]  # no value written over a cut bar
        plt.close(fig)


def _committed(folder: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A committed report's table (its table3.csv) and its runs' dev PPL curves (its archive)."""
    root = REPO / "reports" / "results" / folder
    frame = pd.read_csv(root / "table3.csv", index_col="row")
    points = []
    for path in sorted((root / "archive").glob("*/results.json")):
        if "superseded" in path.parent.name:
            continue
        result = json.loads(path.read_text())
        points += [{"row": result["row"], "seed": result["seed"], "step": step, "ppl": ppl,
                    "convergence": result.get("convergence")} for step, ppl in result["dev_ppl_curve"]]
    return frame, pd.DataFrame(points)


def _overlapping_labels(fig: plt.Figure) -> list[tuple[str, str]]:
    """Pairs of drawn texts (tick labels, row labels, legend entries, titles) whose boxes overlap,
    and row labels that cover a point's marker (a Line2D whose gid is 'marker:ROW')."""
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts]
    pairs = [(a, b) for i, (a, box) in enumerate(boxes) for b, other in boxes[i + 1:] if box.overlaps(other)]
    labels = [(t.get_text(), t.get_window_extent(renderer)) for ax in fig.axes for t in ax.texts]
    return pairs + [(name, marker) for name, box in labels for marker, other in _marker_boxes(fig) if box.overlaps(other)]


def _marker_boxes(fig: plt.Figure) -> list[tuple[str, Bbox]]:
    """Each drawn point's marker (gid 'marker:ROW') as a display box, from its data point and size."""
    out = []
    for ax in fig.axes:
        for line in ax.get_lines():
            if not str(line.get_gid()).startswith("marker:"):
                continue
            half = line.get_markersize() / 2 * fig.dpi / 72
            for x, y in line.get_transform().transform(line.get_xydata()):
                out.append((line.get_gid(), Bbox.from_extents(x - half, y - half, x + half, y + half)))
    return out


def _whiskers(ax: plt.Axes) -> list[tuple[float, float, float]]:
    """Every whisker drawn on `ax` as (x, low, high) in data coordinates."""
    out = []
    for container in ax.containers:
        if isinstance(container, ErrorbarContainer):
            for segment in container.lines[2][0].get_segments():
                (x, low), (_, high) = sorted(segment.tolist(), key=lambda p: p[1])
                out.append((x, low, high))
    return out


def _whole_or_marked_cut(fig: plt.Figure) -> list[str]:
    """Whiskers of a scatter figure that run past the axis, or end at its edge without the cut mark
    (a triangle, gid 'cut whisker:ROW', at that x on that edge)."""
    ax = fig.axes[0]
    low_limit, high_limit = ax.get_ylim()
    cuts = {(round(float(line.get_xdata()[0]), 9), float(line.get_ydata()[0])) for line in ax.get_lines()
            if str(line.get_gid()).startswith("cut whisker:")}
    bad = []
    for x, low, high in _whiskers(ax):
        if low < low_limit - 1e-9 or high > high_limit + 1e-9:
            bad.append(f"whisker at {x} runs off the axis: {low}..{high}")
        for end, limit in ((low, low_limit), (high, high_limit)):
            if abs(end - limit) < 1e-9 and (round(x, 9), limit) not in cuts:
                bad.append(f"whisker at {x} cut at {limit} without a mark")
    return bad


@pytest.mark.parametrize("folder", ["cpu-converged-2026-11-22", "cpu-modifications-2026-11-26"])
def test_no_label_covers_another_in_any_figure_of_a_committed_report(folder: str):
    """Every figure of both committed reports, drawn from their committed table and archived
    curves: no two texts overlap (the cpu table's BLEU-vs-parameters once piled A2 on E, B1 on B2),
    no row label covers a marker, and no two markers overlap (base's was hidden among the nine rows
    of its size, whose whiskers merged into one); every whisker of the scatter figures is whole or
    marked as cut (the modifications' ran off the axes); the change chart carries a whisker per row
    with an interval, cuts no bar, bounds BLEU's intervals at -100% and has a tick at or beyond
    each side's farthest bar or whisker (D1's +418% had none above +100); the learning curves
    draw one line per row (the mean over its seeds) with a band for a row of several seeds, and
    label at least three values between 20 and 30 PPL, where the rows separate."""
    frame, curves = _committed(folder)
    drawn = figures(frame, curves)
    groups = [g for g in dict.fromkeys(frame["group"]) if g != "base"]
    assert set(drawn) == {*FIGURES, *(f"curves_{g}.png" for g in groups), *(f"verdicts_{g}.png" for g in groups)}
    for name, fig in drawn.items():
        assert not _overlapping_labels(fig), (name, _overlapping_labels(fig))
        if name.startswith("curves_"):
            low, high = fig.axes[0].get_ylim()
            labelled = [t for t in fig.axes[0].get_yticks() if 20 <= t <= 30 and low <= t <= high]
            assert len(labelled) >= 3 or high < 22 or low > 28, (name, labelled)
            group = name[len("curves_"):-len(".png")]
            rows = [r for r in frame.index if frame.loc[r, "group"] == group] + ["base"]
            lines = [line for line in fig.axes[0].get_lines() if line.get_label() and not line.get_label().startswith("_")]
            assert len(lines) == len(rows), (name, [line.get_label() for line in lines])
            several = [r for r in rows if frame.loc[r, "seeds"] > 1]
            assert len(fig.axes[0].collections) == len(several), name  # a band per row of several seeds
    for name in ("bleu_vs_params.png", "ppl_vs_time.png"):
        fig = drawn[name]
        markers = [box for _, box in _marker_boxes(fig)]
        assert len(markers) == len(frame)
        assert not [(a, b) for i, a in enumerate(markers) for b in markers[i + 1:] if a.overlaps(b)], name
        assert not _whole_or_marked_cut(fig), (name, _whole_or_marked_cut(fig))
    change = drawn["change_vs_base.png"]
    rows = [r for r in frame.index if r != "base"]
    for ax, metric in zip(change.axes, ("ppl", "bleu")):
        whiskers = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
        assert len(whiskers) == frame.loc[rows, f"d_{metric}_low"].notna().sum()
        low, high = ax.get_ylim()
        drawn_values = [y for _, a, b in _whiskers(ax) for y in (a, b)]
        drawn_values += [p.get_height() for c in ax.containers if isinstance(c, BarContainer) for p in c.patches]
        assert min(drawn_values) >= -100 - 1e-9  # nothing, BLEU's intervals included, below -100%
        ticks = ax.get_yticks()
        assert max(ticks) >= max(drawn_values) and min(ticks) <= min(drawn_values), (metric, ticks)
        for r in rows:
            base = frame.loc["base", metric]
            for v in (frame.loc[r, f"d_{metric}_pct"], max(100 * frame.loc[r, f"d_{metric}_low"] / base, -100),
                      100 * frame.loc[r, f"d_{metric}_high"] / base):
                assert pd.isna(v) or low < v < high, (r, metric, v)
    for fig in drawn.values():
        plt.close(fig)


def test_a_whisker_far_beyond_the_points_is_cut_at_the_edge_and_marked():
    """A two-seed row's whisker reaching ten times the other rows' spread would flatten the axis:
    it is cut at the edge and ends in a triangle there, the title says so; the others are whole.
    Rows of one size stand side by side, in the order of their size, each with a tick at its own."""
    frame = pd.DataFrame({"group": ["base", "A", "A", "B"], "params_m": [0.478, 0.478, 0.478, 0.42],
                          "bleu": [4.0, 4.2, 3.8, 3.9], "bleu_ci": [0.3, 0.2, 9.0, 0.4]},
                         index=["base", "A1", "A2", "B1"])
    fig = scatter_figure(frame, "params_m", "bleu", "bleu_ci", "parameters", "BLEU", "t")
    ax = fig.axes[0]
    cuts = [line.get_gid() for line in ax.get_lines() if str(line.get_gid()).startswith("cut whisker:")]
    assert sorted(cuts) == ["cut whisker:A2", "cut whisker:A2"]  # both ends
    assert not _whole_or_marked_cut(fig) and "a whisker cut at the axis" in ax.get_title()
    low, high = ax.get_ylim()
    assert high - low < 3  # the axis keeps to the points, not to A2's +-9
    x = {line.get_gid()[len("marker:"):]: float(line.get_xdata()[0]) for line in ax.get_lines()
         if str(line.get_gid()).startswith("marker:")}
    assert x["B1"] < x["base"] < x["A1"] < x["A2"]  # spread, in order of size (ties: the table's order)
    own = [line for line in ax.get_lines() if str(line.get_gid()).startswith("own x:")]
    assert {line.get_gid() for line in own} == {"own x:base", "own x:A2"}  # A1, in the middle, stays at its own
    assert all(float(line.get_xdata()[0]) == frame.loc[line.get_gid()[len("own x:"):], "params_m"] for line in own)
    assert not _overlapping_labels(fig)
    plt.close(fig)


def test_dodge_keeps_the_order_and_spreads_only_what_is_too_close():
    from reports.figures import dodge

    assert dodge([0.0, 5.0, 10.0], 1.0) == [0.0, 5.0, 10.0]  # nothing too close: nothing moves
    spread = dodge([2.0, 2.0, 2.0, 0.0], 1.0)
    assert spread == [1.0, 2.0, 3.0, 0.0]  # three at one place, centred on it; 0 stays
    chained = dodge([0.0, 0.5, 1.0, 3.0], 1.0)  # a group that grows reaches the next one
    assert chained == sorted(chained) and min(b - a for a, b in zip(chained, chained[1:])) >= 1.0 - 1e-9


def test_the_verdict_figure_marks_when_each_verdict_was_reached():
    """Each row's legend entry gives the share of training from which its verdict held, late or
    still moving; a ring sits on its line at that step; half of training is marked."""
    from reports.trajectory import percent

    frame, curves = _committed("cpu-converged-2026-11-22")
    fig = verdict_curves(frame, curves, "A")
    names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    for row in ("A1", "A2", "A3", "A4"):
        r = frame.loc[row]
        since = percent(r.verdict_since_share)
        state = (f"late, still moving; since {since}" if r.verdict_moving == True  # noqa: E712
                 else f"{'late: ' * (r.verdict_late == True)}held since {since}")  # noqa: E712
        assert f"{row} ({state})" in names, names
        (ring,) = [line for line in fig.axes[0].get_lines() if line.get_gid() == f"reached:{row}"]
        assert float(ring.get_xdata()[0]) == r.verdict_since_step
    assert "A3 (late, still moving; since 99%)" in names  # beyond noise only at its last two evaluations
    assert any(t.startswith("50% of training") for t in names)
    plt.close(fig)
