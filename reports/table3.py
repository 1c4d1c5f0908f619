"""The Table 3 replica as pandas frames: the paper's configuration columns, our dev PPL/BLEU,
parameters, time and throughput beside the paper's values, and each row's change against base.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ablations.params import paper_architecture
from reports.collect import Table3Data


def table3_frame(data: Table3Data, p_values: dict[str, float] | None = None) -> pd.DataFrame:
    """One numeric row per ablation row that has results, in the spec's order (index: row)."""
    p_values = p_values or {}
    runs = data.runs
    if runs.empty:
        return pd.DataFrame()
    agg = runs.groupby("row", sort=False).agg(
        seeds=("seed", "count"), ppl=("ppl", "mean"), ppl_std=("ppl", "std"), bleu=("bleu", "mean"),
        bleu_std=("bleu", "std"), params=("params", "first"), train_time_s=("train_time_s", "mean"),
        tokens_per_s=("tokens_per_s", "mean"), steps=("steps", "first"))
    base_steps = data.spec["base"].get("train_steps")
    records = []
    for row in (r for r in data.spec if r in agg.index):
        entry, c, ours = data.spec[row], paper_architecture(row, data.spec), agg.loc[row]
        paper = entry.get("paper") or {}
        records.append({
            "row": row, "group": entry.get("group", row),
            "N": c.n_layers, "d_model": c.d_model, "d_ff": c.d_ff, "h": c.n_heads, "d_k": c.d_k,
            "d_v": c.d_v, "P_drop": c.dropout, "eps_ls": c.label_smoothing, "positional": c.positional,
            "paper_steps": entry.get("train_steps", base_steps), "steps": int(ours.steps),
            "seeds": int(ours.seeds), "ppl": ours.ppl, "ppl_std": ours.ppl_std,
            "paper_ppl": paper.get("ppl"), "bleu": ours.bleu, "bleu_std": ours.bleu_std,
            "paper_bleu": paper.get("bleu"), "params_m": ours.params / 1e6,
            "paper_params_m": paper.get("params_m"), "train_time_s": ours.train_time_s,
            "tokens_per_s": ours.tokens_per_s, "p_bleu_vs_base": p_values.get(row)})
    frame = pd.DataFrame.from_records(records).set_index("row")
    frame = frame.astype({c: float for c in ("paper_ppl", "paper_bleu", "paper_params_m", "p_bleu_vs_base")})
    if "base" in frame.index:
        for col in ("ppl", "bleu", "paper_ppl", "paper_bleu"):
            base = frame.loc["base", col]
            frame[f"d_{col}"] = frame[col] - base
            # Relative change: our scale's PPL/BLEU and the paper's differ by an order of magnitude.
            frame[f"d_{col}_pct"] = 100 * frame[f"d_{col}"] / base if base else math.nan
        frame.loc["base", "p_bleu_vs_base"] = math.nan
    return frame


def spearman(frame: pd.DataFrame, ours: str, paper: str) -> tuple[float, int]:
    """Spearman's rho between our values and the paper's over the rows that have both (rank, then
    Pearson on the ranks; ties get their average rank)."""
    both = frame[[ours, paper]].dropna()
    if len(both) < 3 or both[ours].nunique() < 2 or both[paper].nunique() < 2:
        return math.nan, len(both)
    ranks = both.rank()
    return float(ranks[ours].corr(ranks[paper])), len(both)


def _num(value: Any, digits: int) -> str:
    return "" if value is None or pd.isna(value) else f"{value:.{digits}f}"


def _signed(value: Any, digits: int) -> str:
    return "" if value is None or pd.isna(value) else f"{value:+.{digits}f}"


def _steps(n: Any) -> str:
    if n is None or pd.isna(n):
        return ""
    return f"{n / 1000:g}K" if n >= 1000 else str(int(n))


def display_frame(frame: pd.DataFrame, tex: bool = False) -> pd.DataFrame:
    """The table as text cells, the paper's configuration first, ours beside the paper's numbers."""
    pm = r" $\pm$ " if tex else " ± "

    def mean_std(mean: Any, std: Any, digits: int) -> str:
        text = _num(mean, digits)
        return text + (pm + _num(std, digits) if text and not pd.isna(std) else "")

    names = {"eps": r"$\epsilon_{ls}$" if tex else "ε_ls", "P": r"$P_{drop}$" if tex else "P_drop",
             "x6": r"$\times 10^6$" if tex else "×10⁶", "d": r"$\Delta$" if tex else "Δ"}
    rows = []
    for row, r in frame.iterrows():
        rows.append({
            "row": row, "N": r.N, "d_model": r.d_model, "d_ff": r.d_ff, "h": r.h, "d_k": r.d_k, "d_v": r.d_v,
            names["P"]: _num(r.P_drop, 1), names["eps"]: _num(r.eps_ls, 1),
            "pos": "sin" if r.positional == "sinusoidal" else r.positional,
            "steps": _steps(r.paper_steps),
            "PPL": mean_std(r.ppl, r.ppl_std, 2), "PPL paper": _num(r.paper_ppl, 2),
            "BLEU": mean_std(r.bleu, r.bleu_std, 2), "BLEU paper": _num(r.paper_bleu, 1),
            f"params {names['x6']}": _num(r.params_m, 2), f"params {names['x6']} paper": _num(r.paper_params_m, 0),
            "train s": _num(r.train_time_s, 0), "tokens/s": _num(r.tokens_per_s, 0),
            f"{names['d']}PPL": _signed(r.get("d_ppl"), 2), f"{names['d']}BLEU": _signed(r.get("d_bleu"), 2),
            "p vs base": _num(r.p_bleu_vs_base, 3),
        })
    table = pd.DataFrame.from_records(rows)
    if tex:
        table.columns = [c.replace("_", r"\_") if "$" not in c else c for c in table.columns]
    return table


def to_markdown(frame: pd.DataFrame) -> str:
    table = display_frame(frame)
    align = ["left" if c in ("row", "pos") else "right" for c in table.columns]
    return table.to_markdown(index=False, disable_numparse=True, colalign=align)


def to_latex(frame: pd.DataFrame, caption: str) -> str:
    return display_frame(frame, tex=True).to_latex(index=False, escape=False, caption=caption,
                                                   label="tab:table3")
