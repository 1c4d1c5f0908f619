"""A tuned table's part of the report (`ablate table3 --tune`; docs/table3.md): per row every candidate's
dev PPL, the value chosen and the verdicts at its own value and at its best."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.ticker import FixedFormatter, FixedLocator

from ablations.record import setting_label, value_text
from reports.collect import Table3Data
from reports.figures import png, readable_log_ticks
from sweeps.study import HALVING

OWN, BEST = "verdict at its own value", "verdict at its best value"


def verdict(r: pd.Series | None) -> str:
    """A row's dev-PPL verdict against base, in words ('' for base, or a row not compared)."""
    d = None if r is None else r.get("d_ppl")
    if r is None or r.name == "base" or d is None or pd.isna(d):
        return ""
    side = "higher" if d > 0 else "lower" if d < 0 else "equal"
    if (beyond := r.get("beyond_noise")) == False:  # noqa: E712 (None and NaN are neither)
        return "within noise"
    return f"{side} PPL" + (" beyond noise" if beyond == True else ", no interval")  # noqa: E712


def tuning_frame(data: Table3Data, own: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """One line per decided row: its values' dev PPLs, the choice, verdicts at `own` and `best`, signs."""
    records = []
    for row in (r for r in data.spec if r in data.tuned_rows):
        record, mine, theirs = data.tuned_rows[row], *(f.loc[row] if row in f.index else None for f in (own, best))
        verdicts, key = (verdict(mine), verdict(theirs)), next(iter(record.own))
        tried = sorted(c.setting[key] for c in record.candidates)  # one key: is the best beyond what was tried?
        edge = "" if not record.chosen or len(record.own) > 1 or len(tried) < 2 else \
            {tried[0]: "lowest tried", tried[-1]: "highest tried"}.get(record.chosen[key], "")
        records.append({"row": row, "own value": setting_label(record.own),
                        **{setting_label(c.setting): c.outcome() for c in record.candidates},
                        "chosen": setting_label(record.chosen) if record.chosen else "none complete (its own)",
                        "at the edge": edge,
                        OWN: verdicts[0], BEST: verdicts[1],
                        "depends on tuning": "yes" if verdicts[0] != verdicts[1] and row != "base" else "",
                        "sign = paper": " → ".join({True: "yes", False: "no"}.get(r.get("ppl_sign_agrees"), "–")
                                                   for r in (mine, theirs) if r is not None)})
    return pd.DataFrame.from_records(records).fillna("")


def headline_clause(table: pd.DataFrame, keys: list[str]) -> str | None:
    """What the headline adds for a tuned table: how many rows' verdicts depend on tuning."""
    judged = table[(table["row"] != "base") & (table[OWN] != "") & (table[BEST] != "")]
    if judged.empty:
        return None
    moved = judged.loc[judged["depends on tuning"] == "yes", "row"].tolist()
    names = f" ({', '.join(moved)})" if moved else ""
    return (f"tuned, each row at its own best {', '.join(key.rsplit('.', 1)[-1] for key in keys)}, the verdict of "
            f"{len(moved)} of the {len(judged)} rows depends on tuning{names}")


def selection(data: Table3Data) -> str:
    """How the tuned values were chosen, which seed, and what the tuned table's runs are."""
    tuning, seed = data.tuning, data.tuning.get("seed")
    tried = "; ".join(f"{key} over {', '.join(map(value_text, values))}" for key, values in tuning.get("values", {}).items())
    rung = (f"{tuning['budget']:g} of a row's steps" if tuning.get("budget") is not None
            else "the row's first dev evaluation")
    return (f"Tuning ({tried}; each row's own value too): every row, base included, tried each value on seed {seed}; "
            f"Optuna's successive halving (reduction factor {HALVING}) compared a candidate's dev PPL with the row's others "
            f"from its first rung ({rung}) on and stopped those behind (the row's own run, the untuned table's, never); "
            f"the complete candidate of lowest final dev PPL was chosen. The choice used the dev set this table "
            f"reports, not a held-out one. The tuned table's seed-{seed} run is the winning candidate itself, chosen "
            f"on its own dev PPL (an optimistic bias its other seeds, trained at the value after the choice, do not "
            f"have); where a row kept its own value, the tuned table's runs are the untuned table's")


def figures(data: Table3Data) -> dict[str, plt.Figure]:
    """Per group: dev PPL against the first tuned setting, a line per row, pruned hollow, chosen ringed."""
    key = next(iter(data.tuning.get("values", {})), None)
    if key is None or not data.tuned_rows:
        return {}
    groups = {row: str(data.spec[row].get("group", row)) for row in data.tuned_rows if row in data.spec}
    out = {}
    for group in dict.fromkeys(g for g in groups.values() if g != "base"):
        rows = ["base"] * ("base" in groups) + [row for row, g in groups.items() if g == group]
        tried = {row: [c for c in data.tuned_rows[row].candidates if c.ppl and c.state in ("complete", "pruned")]
                 for row in rows}
        fig, ax = plt.subplots(figsize=(6.4, 4.8))
        for i, row in enumerate(rows):
            color, record = "black" if row == "base" else plt.get_cmap("tab10")(i % 10), data.tuned_rows[row]
            done = sorted((c.setting[key], c.ppl) for c in tried[row] if c.state == "complete")
            if done:
                ax.plot(*zip(*done), marker="o", color=color, label=row)
            for c in tried[row]:
                if c.state == "pruned" or c.setting == record.chosen:  # hollow; a ring around the chosen
                    ax.plot([c.setting[key]], [c.ppl], marker="o", markerfacecolor="none", color=color,
                            markersize=13 if c.state == "complete" else 6)
        values = sorted({c.setting[key] for row in rows for c in tried[row]})
        if values and min(values) > 0 and max(values) / min(values) >= 4:
            ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(values))
        ax.xaxis.set_major_formatter(FixedFormatter([f"{v:g}" for v in values]))
        ax.xaxis.set_minor_locator(plt.NullLocator())
        ax.set_yscale("log")
        readable_log_ticks(fig, ax)
        ax.set_xlabel(key + (" (log scale)" if ax.get_xscale() == "log" else ""))
        ax.set_ylabel("dev perplexity (log scale)")
        ax.set_title(f"Group {group}: dev PPL at each tuned value, on the tuning seed\n(filled: trained through, "
                     "final dev PPL; hollow: pruned, dev PPL where stopped; ringed: chosen)", fontsize=8)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        out[f"tuning_{group}.png"] = fig
    return out


def render(data: Table3Data) -> dict[str, bytes]:
    return {name: png(fig) for name, fig in figures(data).items()}


def cost(data: Table3Data) -> str | None:
    """What the tuning trained in training FLOPs (parameters x steps) beside the untuned table's."""
    untuned = float((data.runs["params"] * data.runs["steps"]).sum()) if data.tuned is not None else 0.0
    if not untuned:
        return None
    first = data.runs.groupby("row")[["params", "steps"]].first()
    candidates = sum(first.at[row, "params"] * (first.at[row, "steps"] if c.state == "complete" else c.step or 0)
                     for row, record in data.tuned_rows.items() if row in first.index
                     for c in record.candidates if c.setting != record.own)
    moved = [row for row, record in data.tuned_rows.items() if record.chosen not in (None, record.own)]
    runs = data.tuned.runs
    seeds = runs[(runs["seed"] != data.tuning.get("seed")) & runs["row"].isin(moved)]
    more = float((seeds["params"] * seeds["steps"]).sum())
    return (f"Tuning cost, in training FLOPs (parameters x steps trained; every step holds the same tokens): the "
            f"candidates besides each row's own {candidates / untuned:.2f} x the untuned table's, the chosen values' "
            f"other seeds {more / untuned:.2f} x; both tables together {(untuned + candidates + more) / untuned:.2f} x")
