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


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


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
        ax.annotate(label, (px, py), textcoords="offset points", fontsize=8,
                    xytext=(-4 if sx > 0 else 4, (-9 if sy > 0 else 3) + (-10 if sy > 0 else 10) * stack),
                    ha="right" if sx > 0 else "left")
    if xlim:
        ax.set_xlim(*xlim)
    if ylim:
        ax.set_ylim(*ylim)
    group_legend(ax, frame["group"])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title + (OFF_SCALE if xlim or ylim else ""), fontsize=10)
    ax.grid(alpha=0.3)
    return fig


OFF_SCALE = "\n(a row far off the others: an arrow at the edge, its value beside it)"


def _short(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def bleu_vs_params(frame: pd.DataFrame) -> bytes:
    return _png(scatter_figure(frame, "params_m", "bleu", "bleu_ci", "parameters (millions)", "dev BLEU",
                               "Dev BLEU against model size (colour: group; bars: 95% CI over seeds)"))


def ppl_vs_time(frame: pd.DataFrame) -> bytes:
    return _png(scatter_figure(frame, "train_time_s", "ppl", "ppl_ci", "training time (s)",
                               "dev perplexity (per wordpiece)",
                               "Dev perplexity against training time (bars: 95% CI over seeds)", robust_x=True))


OUTSIDE_RIGHT = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}  # a legend beside the axes


def change_vs_base(frame: pd.DataFrame) -> bytes:
    return _png(change_vs_base_figure(frame))


def change_vs_base_figure(frame: pd.DataFrame) -> plt.Figure:
    """Per-row bars of the relative change of PPL and BLEU against base (%): ours solid, the
    paper's hatched where the table has the paper's numbers (relative, since our CPU-scale values
    and the paper's differ in magnitude). A bar far beyond the others (`robust_limits`) is cut at
    the axis edge, its value written there. The legends sit right of the axes, clear of every
    bar, and row names longer than a bar's width (the modifications' names) are written upright."""
    rows = [r for r in frame.index if r != "base"]
    with_paper = has_paper(frame)  # a spec without the paper's numbers: our bars alone
    fig, axes = plt.subplots(2, 1, figsize=(max(6.4, 0.45 * len(rows) + 2), 6.0), sharex=True)
    positions = range(len(rows))
    cut = False
    by_group = group_colors(frame["group"])
    colors = [by_group[frame.loc[r, "group"]] for r in rows]
    for ax, metric, label in ((axes[0], "ppl", "PPL vs base, % (lower is better)"),
                              (axes[1], "bleu", "BLEU vs base, % (higher is better)")):
        bars = {}
        for name in (f"d_{metric}_pct", f"d_paper_{metric}_pct"):
            column = frame[name] if name in frame else pd.Series(0.0, index=frame.index)
            bars[name] = [0.0 if pd.isna(column[r]) else float(column[r]) for r in rows]
        ours, paper = bars.values()
        drawn = [(-0.2, ours), (0.2, paper)] if with_paper else [(0.0, ours)]  # (shift, values)
        ax.bar([p + drawn[0][0] for p in positions], ours, width=0.4, color=colors)
        if with_paper:
            ax.bar([p + 0.2 for p in positions], paper, width=0.4, color="white", edgecolor=colors,
                   hatch="///")
        if limits := robust_limits([v for _, values in drawn for v in values]):
            limits = (min(limits[0], 0.0), max(limits[1], 0.0))  # the bars start at zero: never cut it off
            ax.set_ylim(*limits)
            cut = True
            for shift, values in drawn:
                for p, v in zip(positions, values):
                    edge, side = _edge(v, limits)
                    if side:
                        ax.annotate(f"{v:+.0f}%", (p + shift, edge), ha="center", va="top" if side > 0 else "bottom",
                                    fontsize=7, fontweight="bold",
                                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none"})
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    if with_paper:  # which bar is whose, in grey: the colours are the groups'
        axes[0].legend(handles=[Patch(color="grey", label="ours"),
                                Patch(facecolor="white", edgecolor="grey", hatch="///", label="paper")], fontsize=8,
                       **OUTSIDE_RIGHT)
    group_legend(axes[1], [frame.loc[r, "group"] for r in rows], marker="s", **OUTSIDE_RIGHT)
    upright = max(map(len, rows), default=0) > 4  # about the most characters a bar's width holds at this size
    axes[1].set_xticks(list(positions), rows, rotation=90 if upright else 0, fontsize=8)
    axes[0].set_title("Relative change against base, per row"
                      + ("\n(a bar far beyond the others is cut at the edge, its value written there)" if cut else ""),
                      fontsize=10)
    return fig


CLASS_STYLES = {"converged": "solid", "still improving": "dashed", "overfitting": (0, (6, 2, 1, 2, 1, 2)),
                "unstable": "dotted", "diverged": "dotted", "unknown": "dashdot"}


def learning_curves(curves: pd.DataFrame, group: str, groups: dict[str, str]) -> bytes:
    """Dev PPL against step for every row of `group` and base, one line per (row, seed).

    `curves` has columns row, seed, step, ppl, convergence; `groups` maps row -> group. Line
    style shows the run's convergence class (solid: converged, dashed: still improving,
    dash-dot-dot: overfitting, dotted: unstable or diverged); the y axis is logarithmic.
    """
    rows = [r for r in dict.fromkeys(curves["row"]) if groups.get(r) == group or r == "base"]
    palette = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, row in enumerate(rows):
        color = "black" if row == "base" else palette(i % 10)
        for j, (seed, run) in enumerate(curves[curves["row"] == row].groupby("seed", sort=True)):
            run = run.sort_values("step")
            label = row if j == 0 else None
            style = CLASS_STYLES.get(str(run["convergence"].iloc[0]), "solid")
            ax.plot(run["step"], run["ppl"], linestyle=style, color=color, linewidth=1.2, alpha=0.85, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("dev perplexity (log scale)")
    ax.set_title(f"Group {group}: dev PPL while training\n(solid converged, dashed still improving, "
                 "dash-dot-dot overfitting, dotted unstable/diverged)", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _png(fig)


# the change against base first: it answers the table's question row by row
FIGURES = {"change_vs_base.png": change_vs_base, "bleu_vs_params.png": bleu_vs_params,
           "ppl_vs_time.png": ppl_vs_time}


def render_all(frame: pd.DataFrame, curves: pd.DataFrame | None = None) -> dict[str, bytes]:
    """The summary figures, and a learning-curve figure per group when curves are given."""
    pictures = {name: draw(frame) for name, draw in FIGURES.items()}
    if curves is not None and not curves.empty:
        groups = frame["group"].to_dict()
        for group in dict.fromkeys(g for g in frame["group"] if g != "base"):
            pictures[f"curves_{group}.png"] = learning_curves(curves, group, groups)
    return pictures
