"""The report's figures (matplotlib, PNG bytes): the change of every row against base, ours beside
the paper's where the spec has its numbers, BLEU vs parameters, PPL vs training time, and learning
curves per group. A row far off the others does not flatten an axis: the axis keeps to the rest
(`robust_limits`), and that row is drawn at the edge with its value written there."""

from __future__ import annotations

import io
import math
from collections.abc import Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from adjustText import adjust_text  # noqa: E402
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedFormatter, FixedLocator  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402
from PIL import Image  # noqa: E402

from reports.table3 import has_paper  # noqa: E402

PALETTE = [f"tab:{name}" for name in ("blue", "orange", "green", "red", "purple", "brown", "pink", "olive",
                                      "cyan", "gray")]


def group_colors(groups: Iterable[str]) -> dict[str, str]:
    """A colour per group: base black, every other group one of matplotlib's tab10 in the order the
    groups first appear (Table 3's A, B, C, D, E, big: blue, orange, green, red, purple, brown)."""
    others = [group for group in dict.fromkeys(groups) if group != "base"]
    return {"base": "black", **{group: PALETTE[i % len(PALETTE)] for i, group in enumerate(others)}}


def group_legend(ax: plt.Axes, groups: Iterable[str], marker: str = "o", **options) -> Legend:
    """A legend naming the colour of each group in `groups`, in the order they first appear."""
    present = list(dict.fromkeys(groups))
    colors = group_colors(present)
    handles = [Line2D([], [], marker=marker, linestyle="", color=colors[group], label=group) for group in present]
    return ax.legend(handles=handles, title="group", fontsize=7, title_fontsize=7, **options)


def png(fig: plt.Figure) -> bytes:
    """The figure as a PNG of at most 256 colours (a report holds some twenty figures, inlined in
    its report.html: full colour would make that page over a megabyte). Same figure, same bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB").quantize(256, dither=Image.Dither.NONE)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def kept_range(values: Iterable[float]) -> tuple[float, float, int, int]:
    """The range an axis shows so that a few far-off values do not flatten the rest: the fewest
    largest values (at most a quarter of them) whose gap to the others exceeds the others' own
    range are left out, then likewise the smallest. Returns (low, high) of the values kept and
    how many were left out above and below."""
    v = sorted(x for x in values if x is not None and math.isfinite(x))
    n, most = len(v), len(v) // 4

    def far(rest: list[float], k: int, side: int) -> bool:
        inner = rest[-k - 1] if side > 0 else rest[k]
        outer = rest[-k] if side > 0 else rest[k - 1]
        kept = rest[:-k] if side > 0 else rest[k:]
        return abs(outer - inner) > kept[-1] - kept[0] > 0

    above = next((k for k in range(1, most + 1) if far(v, k, +1)), 0)
    v = v[:n - above]
    below = next((k for k in range(1, most - above + 1) if far(v, k, -1)), 0)
    v = v[below:]
    return (v[0], v[-1], above, below) if v else (math.nan, math.nan, 0, 0)


def robust_limits(values: Iterable[float]) -> tuple[float, float] | None:
    """Axis limits around the values `kept_range` keeps, with room at a side where values were left
    out for the marks drawn there; None when none were (the axis scales itself)."""
    low, high, above, below = kept_range(values)
    if not (above or below):
        return None
    pad = 0.06 * ((high - low) or abs(high) or 1.0)
    return low - (3 if below else 1) * pad, high + (3 if above else 1) * pad


def _edge(value: float, limits: tuple[float, float] | None) -> tuple[float, int]:
    """Where a value is drawn on an axis with `limits`: itself, or just inside the edge it lies
    beyond, with the side (+1 above, -1 below, 0 inside)."""
    if limits is None or math.isnan(value) or limits[0] <= value <= limits[1]:
        return value, 0
    inset = 0.04 * (limits[1] - limits[0])
    return (limits[1] - inset, 1) if value > limits[1] else (limits[0] + inset, -1)


MARKER_PT = 5.5  # a point's marker, in points
DODGE_PT = 6.5  # centre to centre, in points, of markers spread side by side (their whiskers' caps: 5 wide)


def dodge(xs: list[float], spacing: float) -> list[float]:
    """Positions for markers at `xs` such that no two centres are closer than `spacing`: markers
    nearer than that form a group, spread side by side around the group's mean in the order of
    their values (ties: in the order given); groups that then come too close merge. Their
    whiskers, which would otherwise merge into one (the nine rows of base's size in Table 3),
    stand apart, and the order of the values is kept."""
    order = sorted(range(len(xs)), key=lambda i: (xs[i], i))
    clusters = [[i] for i in order]

    def extent(cluster: list[int]) -> tuple[float, float]:
        centre = sum(xs[i] for i in cluster) / len(cluster)
        half = (len(cluster) - 1) / 2 * spacing
        return centre - half, centre + half

    k = 0
    while k < len(clusters) - 1:
        if extent(clusters[k + 1])[0] - extent(clusters[k])[1] < spacing * (1 - 1e-9):
            clusters[k:k + 2] = [clusters[k] + clusters[k + 1]]
            k = max(k - 1, 0)  # the merged group is wider: it may now reach the one before
        else:
            k += 1
    out = list(xs)
    for cluster in clusters:
        low = extent(cluster)[0]
        for j, i in enumerate(cluster):
            out[i] = low + j * spacing
    return out


def value_limits(values: list[float], lows: list[float], highs: list[float],
                 robust: tuple[float, float] | None) -> tuple[float, float]:
    """An axis' limits: around the values drawn and every whisker end (`lows`, `highs`), but for
    whisker ends far off the rest (`kept_range` over the values and the ends on that side: a
    two-seed row's interval ten times the others'), which are cut at the edge; with `robust`'s
    room where a far-off value was left out, for the marks drawn there."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return robust or (0.0, 1.0)
    low = min(kept_range(finite + [v for v in lows if math.isfinite(v)])[0], *finite)  # each side on its own:
    high = max(kept_range(finite + [v for v in highs if math.isfinite(v)])[1], *finite)  # a far end inflates the other's range
    pad = 0.06 * ((high - low) or abs(high) or 1.0)
    bottom, top = low - pad, high + pad
    if robust:
        bottom, top = min(bottom, robust[0]), max(top, robust[1])
    return bottom, top


CUT = {1: "^", -1: "v"}  # a whisker cut at the top or bottom of the axis ends in this mark there


def scatter_figure(frame: pd.DataFrame, x: str, y: str, y_err: str, xlabel: str, ylabel: str, title: str,
                   robust_x: bool = False) -> plt.Figure:
    """One point per row with its error bar (whisker), x on a log axis (a model's size, a training
    time). A row far off the others (`robust_limits`, on y and where `robust_x` on x) is drawn as
    an arrow at the edge with its value written beside it. Every other whisker is whole, unless it
    reaches far beyond the others (`value_limits`): then it is cut at the edge and ends in a
    triangle there (`CUT`), which the title explains. Markers closer than DODGE_PT
    side by side are spread (`dodge`, in the order of their values), so that neither they nor
    their whiskers hide each other, and a tick on the x axis gives each spread row's own value;
    base is drawn on top. adjustText places the labels so that none covers another, a marker or
    the legend (`place_labels`)."""
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    rows = list(frame.index)
    colors = group_colors(frame["group"])
    lx = pd.Series([math.log10(v) if v > 0 else math.nan for v in frame[x]], index=rows)  # the axis is log
    robust_xlim = robust_limits(lx) if robust_x else None
    robust_ylim = robust_limits(frame[y])
    # where each row lies against the values kept: inside, or beyond an edge (+1, -1)
    side_x = {row: _edge(lx[row], robust_xlim)[1] for row in rows}
    side_y = {row: _edge(frame.loc[row, y], robust_ylim)[1] for row in rows}
    inside = [row for row in rows if not side_x[row] and not side_y[row]]
    errors = {row: (0.0 if pd.isna(frame.loc[row, y_err]) else float(frame.loc[row, y_err])) for row in inside}
    ylim = value_limits([float(frame.loc[r, y]) for r in inside], [frame.loc[r, y] - errors[r] for r in inside],
                        [frame.loc[r, y] + errors[r] for r in inside], robust_ylim)
    xlim = value_limits([lx[r] for r in rows if not side_x[r]], [], [], robust_xlim)
    width_pt = fig.get_size_inches()[0] * ax.get_position().width * 72
    spacing = DODGE_PT * (xlim[1] - xlim[0]) / width_pt  # in decades
    placed_x = dodge([_edge(lx[row], xlim if side_x[row] else None)[0] for row in rows], spacing)
    xlim = (min(xlim[0], min(placed_x) - spacing), max(xlim[1], max(placed_x) + spacing))  # a group spread past an edge
    placed = {row: (10 ** px, _edge(frame.loc[row, y], ylim if side_y[row] else None)[0])
              for row, px in zip(rows, placed_x)}
    ax.set_xscale("log")
    ax.set_xlim(10 ** xlim[0], 10 ** xlim[1])
    ax.set_ylim(*ylim)
    arrows = {(0, 0): "o", (1, 0): ">", (-1, 0): "<", (0, 1): "^", (0, -1): "v"}
    cut_any = False
    for row in sorted(rows, key=lambda r: r == "base"):  # base last: on top
        px, py = placed[row]
        color, z = colors[frame.loc[row, "group"]], 3 if row == "base" else 2
        if errors.get(row):
            low, high = max(py - errors[row], ylim[0]), min(py + errors[row], ylim[1])
            ax.errorbar(px, py, yerr=[[py - low], [high - py]], fmt="none", ecolor=color, capsize=2.5, zorder=z)
            for side, end, limit in ((-1, py - errors[row], ylim[0]), (1, py + errors[row], ylim[1])):
                if side * (end - limit) > 0:  # cut at the edge: a triangle marks where
                    ax.plot(px, limit, CUT[side], color=color, markersize=MARKER_PT, clip_on=False, zorder=z,
                            gid=f"cut whisker:{row}")
                    cut_any = True
        marker = arrows.get((side_x[row], side_y[row]), "D")
        ax.plot(px, py, marker, color=color, markersize=MARKER_PT, linestyle="", zorder=z + 1, gid=f"marker:{row}")
    moved = [row for row in rows if not side_x[row] and abs(math.log10(placed[row][0]) - lx[row]) > 0.25 * spacing]
    rug = ax.get_xaxis_transform()
    for row in moved:  # each spread row's own value, as a tick on the x axis in its colour
        ax.plot([frame.loc[row, x]] * 2, [0, 0.025], color=colors[frame.loc[row, "group"]], linewidth=1.2,
                transform=rug, clip_on=False, gid=f"own x:{row}")
    legend = group_legend(ax, frame["group"])
    labels = []
    for row in rows:
        off = [_short(frame.loc[row, x])] * bool(side_x[row]) + [_short(frame.loc[row, y])] * bool(side_y[row])
        labels.append(ax.text(*placed[row], f"{row}: {', '.join(off)}" if off else str(row), fontsize=8, zorder=5))
    ax.set_xlabel(xlabel + " (log scale)")
    ax.set_ylabel(ylabel)
    notes = [OFF_SCALE] * bool(robust_xlim or robust_ylim) + [SPREAD_NOTE] * bool(moved) + [CUT_NOTE] * cut_any
    ax.set_title(title + "".join(notes), fontsize=9)
    ax.grid(alpha=0.3)
    readable_log_ticks(fig, ax, axis="x")
    place_labels(fig, ax, labels, [line for line in ax.get_lines() if str(line.get_gid()).startswith(("marker:", "cut"))],
                 avoid=[legend])
    clear_corner(fig, ax)
    return fig


CUT_NOTE = "\n(a whisker cut at the axis ends in a triangle there)"
SPREAD_NOTE = "\n(rows of nearly one value side by side, in its order; ticks on the x axis: their own values)"


def place_labels(fig: plt.Figure, ax: plt.Axes, labels: list, markers: list, avoid: Iterable = ()) -> None:
    """Move `labels` (texts at their points, in data coordinates) with adjustText so that none covers
    another, a marker (each point of the Line2D `markers`) or an artist in `avoid` (the legend); a
    label moved away from its point gets a thin line to it. (A label may cross a whisker: kept
    clear of every whisker, the labels of a crowded group end far from their points.) Iterations
    are bounded by count, not by time, so the same figure gives the same places."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    to_data = ax.transData.inverted()
    boxes = [box.transformed(to_data) for box in marker_boxes(fig, markers)]
    boxes += [a.get_window_extent(renderer).transformed(to_data) for a in avoid if a is not None]
    adjust_text(labels, objects=boxes, ax=ax, iter_lim=2000, expand=(1.1, 1.25), avoid_self=False,
                force_text=(0.3, 0.6), force_static=(0.3, 0.6),
                arrowprops={"arrowstyle": "-", "color": "0.45", "linewidth": 0.6, "shrinkA": 1, "shrinkB": 3})


def marker_boxes(fig: plt.Figure, lines: list) -> list:
    """The display box of every marker of the Line2D `lines` (one per data point)."""
    half = 0.5 * fig.dpi / 72
    out = []
    for line in lines:
        size = line.get_markersize() * half
        for px, py in line.get_transform().transform(line.get_xydata()):
            out.append(Bbox.from_extents(px - size, py - size, px + size, py + size))
    return out


def clear_corner(fig: plt.Figure, ax: plt.Axes) -> None:
    """Hide a y tick label that would touch an x tick label in the axes' lower corner."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    xs = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    for label in ax.get_yticklabels():
        if label.get_text() and any(label.get_window_extent(renderer).overlaps(x) for x in xs):
            label.set_visible(False)


OFF_SCALE = "\n(a row far off the others: an arrow at the edge, its value beside it)"


def _short(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def bleu_vs_params_figure(frame: pd.DataFrame) -> plt.Figure:
    return scatter_figure(frame, "params_m", "bleu", "bleu_ci", "parameters (millions)", "dev BLEU",
                          "Dev BLEU against model size (colour: group; bars: 95% CI over seeds)")


def ppl_vs_time_figure(frame: pd.DataFrame) -> plt.Figure:
    return scatter_figure(frame, "train_time_s", "ppl", "ppl_ci", "training time (s)", "dev perplexity (per wordpiece)",
                          "Dev perplexity against training time (bars: 95% CI over seeds)", robust_x=True)


OUTSIDE_RIGHT = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}  # a legend beside the axes
LINEAR_WITHIN = 10.0  # %: the change chart's axis is linear within ±this, logarithmic beyond


def _interval_pct(frame: pd.DataFrame, row: str, metric: str) -> tuple[float, float] | None:
    """The row's interval of the one test against base, in % of base (None where it has none),
    bounded below at -100%: neither BLEU nor perplexity goes below zero, so no row can be more
    than 100% below base (the t interval of a large BLEU loss reaches past it)."""
    low, high = frame.get(f"d_{metric}_low"), frame.get(f"d_{metric}_high")
    if low is None or high is None or "base" not in frame.index or metric not in frame:
        return None
    base = frame.loc["base", metric]
    if pd.isna(low[row]) or pd.isna(high[row]) or not base:
        return None
    return max(100 * float(low[row]) / base, -100.0), 100 * float(high[row]) / base


# the change chart's ticks, in %: each side's outermost one at or beyond its largest bar or whisker
CHANGE_TICKS = (-100, -50, -20, -10, -5, 0, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


def covering_limits(drawn: list[float]) -> tuple[float, float]:
    """The change chart's limits: on each side the first of CHANGE_TICKS at or beyond the farthest
    value drawn there (at least ±LINEAR_WITHIN), with room beyond it, so that a tick covers the
    largest bar (the cpu table's D1 at +418% reads between +200 and +500)."""
    top = next((t for t in CHANGE_TICKS if t >= max([LINEAR_WITHIN, *drawn])), CHANGE_TICKS[-1])
    bottom = next((t for t in reversed(CHANGE_TICKS) if t <= min([-LINEAR_WITHIN, *drawn])), CHANGE_TICKS[0])
    return 1.45 * bottom, 1.45 * top


def readable_ticks(fig: plt.Figure, ax: plt.Axes, ticks: list[float], fontsize: float = 8) -> list[float]:
    """`ticks` less any whose label would touch the one kept before it, from zero outwards on each
    side (the symmetric-log axis packs 5, 10 and 20 close); each side's outermost one stays, in
    place of the one kept before it if they touch: it is the one that covers the largest bar."""
    def at(t: float) -> float:  # points up the figure
        return ax.transData.transform([(0, t)])[0][1] * 72 / fig.dpi

    kept = [0] if 0 in ticks else []
    for side in (sorted(t for t in ticks if t > 0), sorted((t for t in ticks if t < 0), reverse=True)):
        chosen: list[float] = []
        for t in side:
            before = chosen[-1] if chosen else (0 if kept else None)
            if before is None or abs(at(t) - at(before)) >= 1.4 * fontsize:
                chosen.append(t)
        if side and side[-1] not in chosen:
            chosen[-1:] = [side[-1]]
        kept += chosen
    return sorted(kept)


def change_vs_base_figure(frame: pd.DataFrame) -> plt.Figure:
    """Per-row bars of the relative change of PPL and BLEU against base (%), each of ours with the
    95% interval of the report's test (whiskers), and the paper's hatched where the table has the
    paper's numbers (relative, since our CPU-scale values and the paper's differ in magnitude).
    Every bar is drawn to scale: the axis is symmetric-logarithmic, linear within ±10% and
    logarithmic beyond, so a row at +400% and one at +2% are both whole and readable. The legends
    sit right of the axes, clear of every bar, and row names longer than a bar's width (the
    modifications' names) are written upright."""
    rows = [r for r in frame.index if r != "base"]
    with_paper = has_paper(frame)  # a spec without the paper's numbers: our bars alone
    fig, axes = plt.subplots(2, 1, figsize=(max(6.4, 0.45 * len(rows) + 2), 6.4), sharex=True)
    positions = range(len(rows))
    by_group = group_colors(frame["group"])
    colors = [by_group[frame.loc[r, "group"]] for r in rows]
    for ax, metric, label in ((axes[0], "ppl", "PPL vs base, %\n(lower is better)"),
                              (axes[1], "bleu", "BLEU vs base, %\n(higher is better)")):
        bars = {}
        for name in (f"d_{metric}_pct", f"d_paper_{metric}_pct"):
            column = frame[name] if name in frame else pd.Series(0.0, index=frame.index)
            bars[name] = [0.0 if pd.isna(column[r]) else float(column[r]) for r in rows]
        ours, paper = bars.values()
        shift = -0.2 if with_paper else 0.0
        ax.bar([p + shift for p in positions], ours, width=0.4, color=colors)
        intervals = [_interval_pct(frame, r, metric) for r in rows]
        for p, v, interval in zip(positions, ours, intervals):
            if interval:
                ax.errorbar(p + shift, v, yerr=[[v - interval[0]], [interval[1] - v]], fmt="none", ecolor="black",
                            elinewidth=1.0, capsize=2.5)
        if with_paper:
            ax.bar([p + 0.2 for p in positions], paper, width=0.4, color="white", edgecolor=colors,
                   hatch="///")
        ax.set_yscale("symlog", linthresh=LINEAR_WITHIN, linscale=1.0)
        drawn = ours + paper + [x for i in intervals if i for x in i]
        ax.set_ylim(*covering_limits(drawn))  # every bar and whisker whole, a tick beyond the largest
        ticks = readable_ticks(fig, ax, [t for t in CHANGE_TICKS if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]])
        ax.set_yticks(ticks, [f"{t:+d}" if t else "0" for t in ticks], fontsize=8)
        ax.yaxis.set_minor_locator(plt.NullLocator())
        ax.axhspan(-LINEAR_WITHIN, LINEAR_WITHIN, color="0.93", zorder=0)  # the linear part
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color="grey", label="ours"), Line2D([], [], color="black", marker="|", linestyle="",
                                                         markersize=8, label="ours: 95% interval\n(bounded at −100%)")]
    if with_paper:  # which bar is whose, in grey: the colours are the groups'
        handles.append(Patch(facecolor="white", edgecolor="grey", hatch="///", label="paper"))
    handles.append(Patch(color="0.93", label=f"linear within ±{LINEAR_WITHIN:g}%"))
    axes[0].legend(handles=handles, fontsize=8, **OUTSIDE_RIGHT)
    group_legend(axes[1], [frame.loc[r, "group"] for r in rows], marker="s", **OUTSIDE_RIGHT)
    upright = max(map(len, rows), default=0) > 4  # about the most characters a bar's width holds at this size
    axes[1].set_xticks(list(positions), rows, rotation=90 if upright else 0, fontsize=8)
    axes[0].set_title("Relative change against base, per row (whiskers: 95% interval)\n"
                      f"symmetric log axis: linear within ±{LINEAR_WITHIN:g}%, logarithmic beyond; no bar or whisker is cut",
                      fontsize=10)
    return fig


# values a log axis may label, finest first where rows separate (20-30 PPL at the cpu scale)
NICE = sorted({round(m * 10 ** e, 6) for e in range(-2, 5)
               for m in (1, 1.2, 1.4, 1.6, 1.8, 2, 2.2, 2.4, 2.6, 2.8, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 9)})


def readable_log_ticks(fig: plt.Figure, ax: plt.Axes, fontsize: float = 8, axis: str = "y") -> None:
    """Label a log axis at as many round values as fit without two labels touching: from the low
    end up, a value is kept when it lies far enough from the last one kept (on y 1.35 label
    heights; on x half of both labels' widths and a gap). The axis' own labels on a log scale are
    the decades alone, two of them between 20 and 300."""
    low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
    size = fig.get_size_inches()[1] * ax.get_position().height if axis == "y" else \
        fig.get_size_inches()[0] * ax.get_position().width
    per_decade = size * 72 / math.log10(high / low)  # points

    def gap(a: float, b: float) -> float:
        if axis == "y":
            return 1.35 * fontsize
        return 0.3 * fontsize * (len(f"{a:g}") + len(f"{b:g}")) + 0.8 * fontsize

    kept: list[float] = []
    for v in (v for v in NICE if low <= v <= high):
        if not kept or per_decade * math.log10(v / kept[-1]) >= gap(kept[-1], v):
            kept.append(v)
    which = ax.yaxis if axis == "y" else ax.xaxis
    which.set_major_locator(FixedLocator(kept))
    which.set_major_formatter(FixedFormatter([f"{v:g}" for v in kept]))
    which.set_minor_locator(plt.NullLocator())
    ax.tick_params(axis=axis, labelsize=fontsize)


def verdict_curves(frame: pd.DataFrame, curves: pd.DataFrame, group: str) -> plt.Figure:
    """The verdict over training for the rows of `group`: each row's dev PPL difference to base at
    every evaluation both have, with the 95% interval of the report's test shaded, on a symmetric
    log axis (linear within ±2 PPL); the last 20% of the evaluations, where the 'still moving' rule
    looks, is marked, and a row whose verdict moved there is named so in the legend. A ring marks
    where each row's final verdict was reached, the legend gives that share of training and flags
    a late verdict, and a dotted line marks half of training (a verdict reached after it is late)."""
    from reports.trajectory import LAST_SHARE, LATE_SHARE, paired_curves, percent

    rows = [r for r in frame.index if frame.loc[r, "group"] == group and r != "base"]
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    palette = plt.get_cmap("tab10")
    last_start = None
    reach = 2.0
    for i, row in enumerate(rows):
        paired = paired_curves(curves, row)
        if paired.empty:
            continue
        color = palette(i % 10)
        label = row + _reached_label(frame.loc[row], percent)
        ax.plot(paired["step"], paired["d"], color=color, linewidth=1.4, marker="o", markersize=2.5, label=label)
        ax.fill_between(paired["step"], paired["low"], paired["high"], color=color, alpha=0.15, linewidth=0)
        reach = max(reach, *paired[["d", "low", "high"]].abs().max().dropna().tolist())
        k = min(len(paired), max(2, math.ceil(LAST_SHARE * len(paired))))
        start = paired["step"].iloc[-k]
        last_start = start if last_start is None else min(last_start, start)
    if last_start is not None:
        ax.axvspan(last_start, ax.get_xlim()[1], color="0.9", zorder=0, label=f"last {LAST_SHARE:.0%} of evaluations")
    end = None  # the last evaluation the rows judged share with base
    for i, row in enumerate(rows):  # where each final verdict was reached: a ring on its line
        since = frame.loc[row].get("verdict_since_step") if "verdict_since_step" in frame else None
        if since is None or pd.isna(since):
            continue
        paired = paired_curves(curves, row)
        at = paired.loc[paired["step"] == since, "d"]
        if len(at):
            ax.plot([since], [at.iloc[0]], "o", markersize=9, markerfacecolor="none", markeredgewidth=1.4,
                    color=palette(i % 10), zorder=4, gid=f"reached:{row}")
            end = max(end or 0, paired["step"].iloc[-1])
    if end is not None:
        ax.plot([], [], "o", markersize=9, markerfacecolor="none", color="0.3", label="final verdict reached")
        ax.axvline(LATE_SHARE * end, color="0.3", linestyle=":", linewidth=1.0,
                   label=f"{LATE_SHARE:.0%} of training: a verdict\nreached after it is late")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_yscale("symlog", linthresh=2.0)
    ax.set_ylim(-reach * 1.5, reach * 1.5)
    ticks = [t for t in (-300, -100, -30, -10, -5, -2, -1, 0, 1, 2, 5, 10, 30, 100, 300) if abs(t) <= reach * 1.5]
    ax.set_yticks(ticks, [f"{t:+d}" if t else "0" for t in ticks], fontsize=8)
    ax.yaxis.set_minor_locator(plt.NullLocator())
    ax.set_xlabel("training step")
    ax.set_ylabel("dev PPL − base's (symmetric log axis)")
    ax.set_title(f"Group {group}: the difference to base while training\n(shaded: 95% interval over seeds; "
                 "above zero: worse than base)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, **OUTSIDE_RIGHT)
    return fig


def _reached_label(r: pd.Series, percent) -> str:
    """What a row's legend entry says of its verdict: when it was reached, late or still moving."""
    share = r.get("verdict_since_share")
    if share is None or pd.isna(share):
        return " (not judged)"
    if r.get("verdict_moving") == True:  # noqa: E712
        return f" (late, still moving; since {percent(share)})"
    return f" ({'late: ' if r.get('verdict_late') == True else ''}held since {percent(share)})"  # noqa: E712


CLASS_STYLES = {"converged": "solid", "still improving": "dashed", "overfitting": (0, (6, 2, 1, 2, 1, 2)),
                "unstable": "dotted", "diverged": "dotted", "unknown": "dashdot"}


def seed_band(curves: pd.DataFrame, row: str) -> pd.DataFrame:
    """The row's dev PPL over its seeds at each step they all evaluated (a resumed run's steps a
    step or two off the grid aligned to it, as `reports.trajectory.on_grid` does): columns step,
    mean, low and high (the seeds' range). The grid is the steps of the seed with the most."""
    from reports.trajectory import on_grid

    runs = curves[curves["row"] == row]
    if runs.empty:
        return pd.DataFrame(columns=["step", "mean", "low", "high"])
    counts = runs.groupby("seed")["step"].nunique()
    grid = sorted(set(runs.loc[runs["seed"] == counts.idxmax(), "step"]))
    aligned = on_grid(runs, grid)
    band = aligned.groupby("step")["ppl"].agg(["mean", "min", "max", "count"]).reset_index()
    band = band[band["count"] == runs["seed"].nunique()]
    return band.rename(columns={"min": "low", "max": "high"})[["step", "mean", "low", "high"]]


def learning_curves_figure(curves: pd.DataFrame, group: str, groups: dict[str, str]) -> plt.Figure:
    """Dev PPL against step for every row of `group` and base: the mean over the row's seeds, with
    their range as a band (one line per row: rows 1 PPL apart stay apart, where a line per seed
    drew some twenty lines in group C).

    `curves` has columns row, seed, step, ppl, convergence; `groups` maps row -> group. Line style
    shows the worst convergence class over the row's seeds (solid: converged, dashed: still
    improving, dash-dot-dot: overfitting, dotted: unstable or diverged); the y axis is logarithmic.
    """
    from reports.table3 import convergence_summary

    rows = [r for r in dict.fromkeys(curves["row"]) if groups.get(r) == group and r != "base"]
    palette = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    for row in ["base"] * bool((curves["row"] == "base").any()) + rows:  # base first, in black
        color = "black" if row == "base" else palette(rows.index(row) % 10)
        runs = curves[curves["row"] == row]
        band, seeds = seed_band(curves, row), runs["seed"].nunique()
        worst = str(convergence_summary(runs.groupby("seed")["convergence"].first()) or "").split(" (")[0]
        ax.plot(band["step"], band["mean"], linestyle=CLASS_STYLES.get(worst, "solid"), color=color, linewidth=1.4,
                marker="o" if len(band) == 1 else None, label=f"{row} ({seeds} seeds)" if seeds > 1 else row)
        if seeds > 1:
            ax.fill_between(band["step"], band["low"], band["high"], color=color, alpha=0.15, linewidth=0)
    ax.set_yscale("log")
    readable_log_ticks(fig, ax)
    ax.set_xlabel("training step")
    ax.set_ylabel("dev perplexity (log scale)")
    ax.set_title(f"Group {group}: dev PPL while training, mean over seeds (band: their range)\n(the row's worst class: "
                 "solid converged, dashed still improving, dash-dot-dot overfitting, dotted unstable/diverged)",
                 fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig


# The report's summary figures in the order it shows them (docs/table3.md#adding-a-report-figure):
# the change against base first, it answers the table's question row by row.
FIGURES = {"change_vs_base.png": change_vs_base_figure, "bleu_vs_params.png": bleu_vs_params_figure,
           "ppl_vs_time.png": ppl_vs_time_figure}


def figures(frame: pd.DataFrame, curves: pd.DataFrame | None = None) -> dict[str, plt.Figure]:
    """Every figure of the report, drawn (not yet saved): the summary figures (`FIGURES`), then per
    group its learning curves and its verdict over training when curves are given."""
    out = {name: draw(frame) for name, draw in FIGURES.items()}
    if curves is not None and not curves.empty:
        groups = frame["group"].to_dict()
        for group in dict.fromkeys(g for g in frame["group"] if g != "base"):
            out[f"curves_{group}.png"] = learning_curves_figure(curves, group, groups)
        if "verdict_moving" in frame:
            for group in dict.fromkeys(g for g in frame["group"] if g != "base"):
                out[f"verdicts_{group}.png"] = verdict_curves(frame, curves, group)
    return out


def render_all(frame: pd.DataFrame, curves: pd.DataFrame | None = None) -> dict[str, bytes]:
    """The report's figures as PNG bytes (`figures`)."""
    return {name: png(fig) for name, fig in figures(frame, curves).items()}
