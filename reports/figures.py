"""The report's figures (matplotlib, PNG bytes): BLEU vs parameters, PPL vs training time, and the
change of every row against base, ours beside the paper's."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

GROUP_COLORS = {"base": "black", "A": "tab:blue", "B": "tab:orange", "C": "tab:green", "D": "tab:red",
                "E": "tab:purple", "big": "tab:brown"}


def _color(group: str) -> str:
    return GROUP_COLORS.get(group, "tab:gray")


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _scatter(frame: pd.DataFrame, x: str, y: str, y_err: str, xlabel: str, ylabel: str, title: str) -> bytes:
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for row, r in frame.iterrows():
        ax.errorbar(r[x], r[y], yerr=None if pd.isna(r[y_err]) else r[y_err], fmt="o",
                    color=_color(r.group), capsize=3)
        ax.annotate(str(row), (r[x], r[y]), textcoords="offset points", xytext=(4, 3), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    return _png(fig)


def bleu_vs_params(frame: pd.DataFrame) -> bytes:
    return _scatter(frame, "params_m", "bleu", "bleu_std", "parameters (millions)", "dev BLEU",
                    "Dev BLEU against model size (colour: Table 3 group)")


def ppl_vs_time(frame: pd.DataFrame) -> bytes:
    return _scatter(frame, "train_time_s", "ppl", "ppl_std", "training time (s)",
                    "dev perplexity (per wordpiece)", "Dev perplexity against training time")


def change_vs_base(frame: pd.DataFrame) -> bytes:
    """Per-row bars of the relative change of PPL and BLEU against base (%): ours solid, the
    paper's hatched (relative, since our CPU-scale values and the paper's differ in magnitude)."""
    rows = [r for r in frame.index if r != "base"]
    fig, axes = plt.subplots(2, 1, figsize=(max(6.4, 0.45 * len(rows) + 2), 6.0), sharex=True)
    positions = range(len(rows))
    for ax, metric, label in ((axes[0], "ppl", "PPL vs base, % (lower is better)"),
                              (axes[1], "bleu", "BLEU vs base, % (higher is better)")):
        colors = [_color(frame.loc[r, "group"]) for r in rows]
        ours = [frame.loc[r, f"d_{metric}_pct"] if f"d_{metric}_pct" in frame else 0.0 for r in rows]
        paper = [frame.loc[r, f"d_paper_{metric}_pct"] if f"d_paper_{metric}_pct" in frame else 0.0
                 for r in rows]
        ax.bar([p - 0.2 for p in positions], [0.0 if pd.isna(v) else v for v in ours], width=0.4,
               color=colors, label="ours")
        ax.bar([p + 0.2 for p in positions], [0.0 if pd.isna(v) else v for v in paper], width=0.4,
               color="white", edgecolor=colors, hatch="///", label="paper")
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_ylabel(label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[1].set_xticks(list(positions), rows, rotation=0, fontsize=8)
    axes[0].set_title("Relative change against base, per Table 3 row", fontsize=10)
    return _png(fig)


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


FIGURES = {"bleu_vs_params.png": bleu_vs_params, "ppl_vs_time.png": ppl_vs_time,
           "change_vs_base.png": change_vs_base}


def render_all(frame: pd.DataFrame, curves: pd.DataFrame | None = None) -> dict[str, bytes]:
    """The summary figures, and a learning-curve figure per group when curves are given."""
    pictures = {name: draw(frame) for name, draw in FIGURES.items()}
    if curves is not None and not curves.empty:
        groups = frame["group"].to_dict()
        for group in dict.fromkeys(g for g in frame["group"] if g != "base"):
            pictures[f"curves_{group}.png"] = learning_curves(curves, group, groups)
    return pictures
