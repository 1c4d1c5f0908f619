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
from matplotlib.legend import Legend  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FixedFormatter, FixedLocator  # noqa: E402
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


def scatter_figure(frame: pd.DataFrame, x: str, y: str, y_err: str, xlabel: str, ylabel: str, title: str,
                   robust_x: bool = False) -> plt.Figure:
    """One point per row with its error bar; a row far off the others (`robust_limits`, on y and
    where `robust_x` on x) is drawn as an arrow at the edge with its value written beside it, the
    labels of the rows at the top or bottom edge (all at one height) stacked inwards so that none
    covers another."""
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    xlim = robust_limits(frame[x]) if robust_x else None
    ylim = robust_limits(frame[y])
    arrows = {(0, 0): "o", (1, 0): ">", (-1, 0): "<", (0, 1): "^", (0, -1): "v"}
    colors = group_colors(frame["group"])
    labels = []
    at_edge = {1: 0, 0: 0, -1: 0}  # labels already written at the top (1) and bottom (-1) edge; 0 never grows
    for row, r in frame.iterrows():
        (px, sx), (py, sy) = _edge(r[x], xlim), _edge(r[y], ylim)
        marker = arrows.get((sx, sy), "D")
        error = None if sx or sy or pd.isna(r[y_err]) else r[y_err]
        ax.errorbar(px, py, yerr=error, fmt=marker, color=colors[r.group], capsize=3)
        off = [_short(r[x])] * bool(sx) + [_short(r[y])] * bool(sy)  # its value on the axis it is off
        label = f"{row}: {', '.join(off)}" if off else str(row)
        stack = at_edge[sy]
        at_edge[sy] += bool(sy)
        labels.append(ax.annotate(label, (px, py), textcoords="offset points", fontsize=8,
                                  xytext=(-4 if sx > 0 else 4, (-9 if sy > 0 else 3) + (-10 if sy > 0 else 10) * stack),
                                  ha="right" if sx > 0 else "left"))
    if xlim:
        ax.set_xlim(*xlim)
    if ylim:
        ax.set_ylim(*ylim)
    legend = group_legend(ax, frame["group"])
    declutter(fig, labels, avoid=[legend])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title + (OFF_SCALE if xlim or ylim else ""), fontsize=10)
    ax.grid(alpha=0.3)
    clear_corner(fig, ax)
    return fig


def clear_corner(fig: plt.Figure, ax: plt.Axes) -> None:
    """Hide a y tick label that would touch an x tick label in the axes' lower corner."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    xs = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
    for label in ax.get_yticklabels():
        if label.get_text() and any(label.get_window_extent(renderer).overlaps(x) for x in xs):
            label.set_visible(False)


# where a label may move from where it was first put, in points (right, then left of its point; up and down)
MOVES = [(0, 0)] + [(dx, dy) for step in (1, 2, 3, 4) for dy in (-9 * step, 9 * step, -4.5 * step, 4.5 * step)
                    for dx in (0, -1)]


def declutter(fig: plt.Figure, labels: list, avoid: Iterable = ()) -> None:
    """Move labels (annotations in offset points) so that none covers another, nor an artist in
    `avoid` (a legend): each in turn keeps the first of `MOVES` (its own place first, then up and
    down in steps of half a line, then on the other side of its point) that overlaps nothing
    placed before it. Deterministic: the same figure gives the same places."""
    fig.canvas.draw()  # limits and the layout as they will be drawn
    renderer = fig.canvas.get_renderer()
    placed = [a.get_window_extent(renderer) for a in avoid if a is not None]
    for label in labels:
        x0, y0 = label.xyann
        align = label.get_ha()
        for dx, dy in MOVES:
            if dx:  # the other side of the point
                label.set_ha("left" if align == "right" else "right")
                label.xyann = (-x0, y0 + dy)
            else:
                label.set_ha(align)
                label.xyann = (x0, y0 + dy)
            box = label.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
        placed.append(label.get_window_extent(renderer))


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
    """The row's interval of the one test against base, in % of base (None where it has none)."""
    low, high = frame.get(f"d_{metric}_low"), frame.get(f"d_{metric}_high")
    if low is None or high is None or "base" not in frame.index or metric not in frame:
        return None
    base = frame.loc["base", metric]
    if pd.isna(low[row]) or pd.isna(high[row]) or not base:
        return None
    return 100 * float(low[row]) / base, 100 * float(high[row]) / base


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
        # every bar and whisker whole, with room beyond it: 1.6 times its reach, on each side
        ax.set_ylim(-1.6 * max([LINEAR_WITHIN, *(-v for v in drawn if v < 0)]),
                    1.6 * max([LINEAR_WITHIN, *(v for v in drawn if v > 0)]))
        ticks = [t for t in (-1000, -100, -30, -10, -5, 0, 5, 10, 30, 100, 1000, 10000)
                 if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        ax.set_yticks(ticks, [f"{t:+d}" if t else "0" for t in ticks], fontsize=8)
        ax.yaxis.set_minor_locator(plt.NullLocator())
        ax.axhspan(-LINEAR_WITHIN, LINEAR_WITHIN, color="0.93", zorder=0)  # the linear part
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color="grey", label="ours"), Line2D([], [], color="black", marker="|", linestyle="",
                                                         markersize=8, label="ours: 95% interval")]
    if with_paper:  # which bar is whose, in grey: the colours are the groups'
        handles.append(Patch(facecolor="white", edgecolor="grey", hatch="///", label="paper"))
    handles.append(Patch(color="0.93", label=f"linear within ±{LINEAR_WITHIN:g}%"))
    axes[0].legend(handles=handles, fontsize=8, **OUTSIDE_RIGHT)
    group_legend(axes[1], [frame.loc[r, "group"] for r in rows], marker="s", **OUTSIDE_RIGHT)
    upright = max(map(len, rows), default=0) > 4  # about the most characters a bar's width holds at this size
    axes[1].set_xticks(list(positions), rows, rotation=90 if upright else 0, fontsize=8)
    axes[0].set_title("Relative change against base, per row (whiskers: 95% interval)\n"
                      f"symmetric log axis: linear within ±{LINEAR_WITHIN:g}%, logarithmic beyond; no bar is cut",
                      fontsize=10)
    return fig


# values a log axis may label, finest first where rows separate (20-30 PPL at the cpu scale)
NICE = sorted({m * 10 ** e for e in range(0, 5) for m in (1, 1.2, 1.4, 1.6, 1.8, 2, 2.2, 2.4, 2.6, 2.8, 3, 3.5, 4, 4.5,
                                                           5, 6, 7, 8, 9)})


def readable_log_ticks(fig: plt.Figure, ax: plt.Axes, fontsize: float = 8) -> None:
    """Label a log y axis at as many round values as fit without two labels touching: from the
    bottom up, a value is kept when it lies at least 1.35 label sizes above the last one kept
    (the axis' own labels on a log scale are the decades alone, two of them between 20 and 300)."""
    low, high = ax.get_ylim()
    height = fig.get_size_inches()[1] * ax.get_position().height * 72  # points
    per_decade = height / math.log10(high / low)
    gap = 1.35 * fontsize
    kept: list[float] = []
    for v in (v for v in NICE if low <= v <= high):
        if not kept or per_decade * math.log10(v / kept[-1]) >= gap:
            kept.append(v)
    ax.yaxis.set_major_locator(FixedLocator(kept))
    ax.yaxis.set_major_formatter(FixedFormatter([f"{v:g}" for v in kept]))
    ax.yaxis.set_minor_locator(plt.NullLocator())
    ax.tick_params(axis="y", labelsize=fontsize)


def verdict_curves(frame: pd.DataFrame, curves: pd.DataFrame, group: str) -> plt.Figure:
    """The verdict over training for the rows of `group`: each row's dev PPL difference to base at
    every evaluation both have, with the 95% interval of the report's test shaded, on a symmetric
    log axis (linear within ±2 PPL); the last 20% of the evaluations, where the 'still moving' rule
    looks, is marked, and a row whose verdict moved there is named so in the legend."""
    from reports.trajectory import LAST_SHARE, paired_curves

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
        moving = frame.loc[row].get("verdict_moving") if "verdict_moving" in frame else None
        label = row + {True: " (verdict still moving)", False: " (verdict held)"}.get(moving, " (not judged)")
        ax.plot(paired["step"], paired["d"], color=color, linewidth=1.4, marker="o", markersize=2.5, label=label)
        ax.fill_between(paired["step"], paired["low"], paired["high"], color=color, alpha=0.15, linewidth=0)
        reach = max(reach, *paired[["d", "low", "high"]].abs().max().dropna().tolist())
        k = min(len(paired), max(2, math.ceil(LAST_SHARE * len(paired))))
        start = paired["step"].iloc[-k]
        last_start = start if last_start is None else min(last_start, start)
    if last_start is not None:
        ax.axvspan(last_start, ax.get_xlim()[1], color="0.9", zorder=0, label=f"last {LAST_SHARE:.0%} of evaluations")
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


CLASS_STYLES = {"converged": "solid", "still improving": "dashed", "overfitting": (0, (6, 2, 1, 2, 1, 2)),
                "unstable": "dotted", "diverged": "dotted", "unknown": "dashdot"}


def learning_curves_figure(curves: pd.DataFrame, group: str, groups: dict[str, str]) -> plt.Figure:
    """Dev PPL against step for every row of `group` and base, one line per (row, seed).

    `curves` has columns row, seed, step, ppl, convergence; `groups` maps row -> group. Line
    style shows the run's convergence class (solid: converged, dashed: still improving,
    dash-dot-dot: overfitting, dotted: unstable or diverged); the y axis is logarithmic.
    """
    rows = [r for r in dict.fromkeys(curves["row"]) if groups.get(r) == group or r == "base"]
    palette = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    for i, row in enumerate(rows):
        color = "black" if row == "base" else palette(i % 10)
        for j, (seed, run) in enumerate(curves[curves["row"] == row].groupby("seed", sort=True)):
            run = run.sort_values("step")
            label = row if j == 0 else None
            style = CLASS_STYLES.get(str(run["convergence"].iloc[0]), "solid")
            ax.plot(run["step"], run["ppl"], linestyle=style, color=color, linewidth=1.2, alpha=0.85, label=label)
    ax.set_yscale("log")
    readable_log_ticks(fig, ax)
    ax.set_xlabel("training step")
    ax.set_ylabel("dev perplexity (log scale)")
    ax.set_title(f"Group {group}: dev PPL while training\n(solid converged, dashed still improving, "
                 "dash-dot-dot overfitting, dotted unstable/diverged)", fontsize=8)
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
