"""The Table 3 ablation as pandas frames: the paper's configuration columns, our dev PPL/BLEU,
parameters, time and throughput beside the paper's values, and each row's change against base.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ablations.params import paper_architecture
from ablations.spec import recipe_changes
from lightning_modules.config import modifications
from reports.collect import Table3Data
from reports.seeds import mean_ci, sign_agrees
from reports.significance import add_corrected, by_row, difference
from reports.trajectory import add_moving, percent


def table3_frame(data: Table3Data, draws: Mapping[tuple[str, int], Any] | None = None) -> pd.DataFrame:
    """One numeric row per ablation row that has results, in the spec's order (index: row).
    `draws`: each run's BLEU on the resamples of the dev sentences (`reports.significance.sentence_draws`),
    the sentence level of BLEU's test against base."""
    runs = data.runs
    if runs.empty:
        return pd.DataFrame()
    agg = runs.groupby("row", sort=False).agg(
        seeds=("seed", "count"), ppl=("ppl", "mean"), ppl_std=("ppl", "std"), bleu=("bleu", "mean"),
        bleu_std=("bleu", "std"), params=("params", "first"), train_time_s=("train_time_s", "mean"),
        tokens_per_s=("tokens_per_s", "mean"), steps=("steps", "first"))
    records = []
    for row in (r for r in data.spec if r in agg.index):
        entry, ours = data.spec[row], agg.loc[row]
        paper = entry.get("paper") or {}
        records.append({
            "row": row, "group": entry.get("group", row), **paper_configuration(row, data.spec),
            "steps": int(ours.steps),
            "seeds": int(ours.seeds), "planned_seeds": max(data.planned.get(row, 0), int(ours.seeds)),
            "ppl": ours.ppl, "ppl_std": ours.ppl_std,
            "paper_ppl": paper.get("ppl"), "bleu": ours.bleu, "bleu_std": ours.bleu_std,
            "paper_bleu": paper.get("bleu"), "params_m": ours.params / 1e6,
            "paper_params_m": paper.get("params_m"), "train_time_s": ours.train_time_s,
            "tokens_per_s": ours.tokens_per_s})
    frame = pd.DataFrame.from_records(records).set_index("row")
    if not frame["recipe"].astype(bool).any():
        frame = frame.drop(columns="recipe")
    frame.attrs["base_configuration"] = paper_configuration("base", data.spec)  # also when base has no run
    frame = frame.astype({c: float for c in ("paper_ppl", "paper_bleu", "paper_params_m")})
    if "base" in frame.index:
        for col in ("ppl", "bleu", "paper_ppl", "paper_bleu"):
            base = frame.loc["base", col]
            frame[f"d_{col}"] = frame[col] - base
            # Relative change: our scale's PPL/BLEU and the paper's differ by an order of magnitude.
            frame[f"d_{col}_pct"] = 100 * frame[f"d_{col}"] / base if base else math.nan
    add_seed_statistics(frame, runs, draws or {})
    if "base" in frame.index:
        set_apart_other_vocabularies(frame, runs)
        add_corrected(frame)
    add_moving(frame, data.curves)
    return frame


PPL_COMPARISONS = ("d_ppl", "d_ppl_pct", "d_ppl_low", "d_ppl_high", "ppl_p")  # against base's


def set_apart_other_vocabularies(frame: pd.DataFrame, runs: pd.DataFrame) -> None:
    """A row whose runs' BPE vocabulary is not base's measures PPL per another wordpiece: its PPL
    is not compared with base's (no difference, test or sign; BLEU is), and the frame says which
    rows (`frame.attrs["other_vocabulary"]`: row -> (its vocabulary, base's))."""
    if "model.vocab_size" not in runs:
        return
    sizes = runs.groupby("row", sort=False)["model.vocab_size"].first()
    base = sizes.get("base")
    other = {row: (int(size), int(base)) for row, size in sizes.items()
             if row in frame.index and base is not None and not pd.isna(size) and size != base}
    for row in other:
        frame.loc[row, list(PPL_COMPARISONS)] = math.nan
        frame.loc[row, ["beyond_noise", "ppl_sign_agrees"]] = None
    frame.attrs["other_vocabulary"] = other


def has_paper(frame: pd.DataFrame) -> bool:
    """Whether the table carries any of the paper's numbers (ablations/table3.yaml does;
    ablations/modifications.yaml has none): without them the report has no paper column, no sign
    comparison and no rank correlation."""
    columns = [c for c in ("paper_ppl", "paper_bleu", "paper_params_m") if c in frame]
    return bool(columns) and bool(frame[columns].notna().to_numpy().any())


def paper_configuration(row: str, spec: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The row's configuration columns at the paper's scale (N, d_model, ..., its training steps)."""
    c = paper_architecture(row, spec)
    columns = {"N": c.n_layers, "d_model": c.d_model, "d_ff": c.d_ff, "h": c.n_heads, "d_k": c.d_k,
               "d_v": c.d_v, "P_drop": c.dropout, "eps_ls": c.label_smoothing, "positional": c.positional,
               "modifications": modifications(c),
               "paper_steps": spec[row].get("train_steps", spec["base"].get("train_steps"))}
    # the row's training and data settings where they differ from base's ('warmup_steps=0'); a
    # table none of whose rows has any leaves the column out (`table3_frame`)
    columns["recipe"] = ", ".join(f"{key.split('.', 1)[1]}={value}" for key, value in recipe_changes(row, spec).items())
    return columns


def convergence_summary(classes: pd.Series) -> str | None:
    """The class when every seed has it, else the worst class and how many seeds had it."""
    classes = classes.dropna()
    if classes.empty:
        return None
    order = ["diverged", "unstable", "overfitting", "unknown", "still improving", "converged"]
    worst = min(classes, key=lambda c: order.index(c) if c in order else 0)
    if (classes == worst).all():
        return worst
    return f"{worst} ({int((classes == worst).sum())}/{len(classes)})"


def add_seed_statistics(frame: pd.DataFrame, runs: pd.DataFrame,
                        draws: Mapping[tuple[str, int], Any] | None = None) -> None:
    """Per row: 95% CI of PPL and BLEU and the convergence class over seeds; with a base row, also
    the difference to base with the interval of the one test (`reports.significance.difference`:
    seeds and, for BLEU, dev sentences), whether it is beyond noise, and the sign agreement with
    the paper."""
    draws = draws or {}
    by_seed = {(row, metric): dict(zip(part["seed"], part[metric]))
               for row, part in runs.groupby("row", sort=False) for metric in ("ppl", "bleu")}
    for row in frame.index:
        for metric in ("ppl", "bleu"):
            values = by_seed.get((row, metric), {})
            ci = mean_ci([v for v in values.values() if v is not None and not pd.isna(v)])
            frame.loc[row, f"{metric}_ci"] = ci.half_width
            if "base" not in frame.index:
                continue  # no difference to base without it
            # PPL per sentence is not stored: its test has the seed level alone
            sentences = (by_row(draws, row), by_row(draws, "base")) if metric == "bleu" else (None, None)
            test = difference(values, by_seed.get(("base", metric), {}), *sentences)
            diff = test.interval
            frame.loc[row, f"d_{metric}_low"], frame.loc[row, f"d_{metric}_high"] = diff.low, diff.high
            # one seed on both sides (no interval) claims nothing either way
            beyond = test.beyond_noise if row != "base" else None
            frame.loc[row, "beyond_noise" if metric == "ppl" else "bleu_beyond_noise"] = beyond
            frame.loc[row, f"{metric}_p"] = test.p if row != "base" else math.nan
            if metric == "ppl":
                frame.loc[row, "ci_method"] = test.method if row != "base" else None
            else:
                frame.loc[row, "bleu_sentence_se"] = math.nan if test.sentence_se is None else test.sentence_se
            agrees = sign_agrees(frame.loc[row, f"d_{metric}"], frame.loc[row, f"d_paper_{metric}"], metric)
            frame.loc[row, f"{metric}_sign_agrees"] = agrees if row != "base" else None
        if "convergence" in runs:
            frame.loc[row, "convergence"] = convergence_summary(runs.loc[runs["row"] == row, "convergence"])


def _num(value: Any, digits: int, sign: str = "") -> str:
    """`value` with `digits` decimals (`sign` "+": always signed); "" for none."""
    return "" if value is None or pd.isna(value) else f"{value:{sign}.{digits}f}"


def _steps(n: Any) -> str:
    if n is None or pd.isna(n):
        return ""
    return f"{n / 1000:g}K" if n >= 1000 else str(int(n))


CONFIG_COLUMNS = {"N": "N", "d_model": "d_model", "d_ff": "d_ff", "h": "h", "d_k": "d_k", "d_v": "d_v",
                  "P_drop": "P_drop", "eps_ls": "eps_ls", "positional": "pos",
                  "modifications": "",  # the later modifications' knobs, 'norm=rmsnorm, ...' (named in the value)
                  "paper_steps": "steps",
                  "recipe": ""}  # a row's training and data settings, 'warmup_steps=0' (named in the value)


def _setting(col: str, value: Any) -> str:
    if col == "positional":
        return "sin" if value == "sinusoidal" else str(value)
    if col == "paper_steps":
        return _steps(value)
    if col == "modifications":
        return value.replace("=", " ") if value else "none of the later modifications"
    if col == "recipe":
        return value.replace("=", " ") if value else "base's training recipe"
    if col in ("P_drop", "eps_ls"):
        return _num(value, 1)
    return str(value)


def changes(r: pd.Series, base: Mapping[str, Any]) -> str:
    """The paper configuration of a row as its changes from base ('N 2', 'P_drop 0.0, pos learned')."""
    if r.name == "base":
        return "the paper's base"
    return ", ".join(f"{name} {_setting(col, r[col])}".strip() for col, name in CONFIG_COLUMNS.items()
                     if col in r and r[col] != base.get(col)) or "as base"


def _seeds(r: pd.Series) -> str:
    """`3`, or `1 of 3` while a row's other seeds are still queued or running."""
    planned = r.get("planned_seeds")
    short = planned is not None and not pd.isna(planned) and planned > r.seeds
    return f"{int(r.seeds)} of {int(planned)}" if short else str(int(r.seeds))


def _beyond(verdict: Any, q: Any) -> str:
    """'yes' or 'no' by the comparison's own interval, with its q over the family of comparisons
    ('yes (q 0.012)'); empty where there is no interval."""
    text = {True: "yes", False: "no"}.get(verdict, "")
    if not text or q is None or pd.isna(q):
        return text
    return f"{text} (q {'< 0.001' if q < 0.001 else f'{q:.3f}'})"


def _since(r: pd.Series) -> str:
    """When the row's PPL verdict was reached, as a share of training ('5%', '80% (late)',
    '96% (still moving)'); empty for base and a row not judged."""
    share = r.get("verdict_since_share")
    if share is None or pd.isna(share):
        return ""
    flag = " (still moving)" if r.get("verdict_moving") == True else " (late)" if r.get("verdict_late") == True else ""  # noqa: E712
    return f"{percent(share)}{flag}"


def display_frame(frame: pd.DataFrame, tex: bool = False) -> pd.DataFrame:
    """The table as text cells, narrow enough for a normal window: the paper configuration as the
    row's changes from base, then ours with the paper's value in parentheses (columns named
    '... (paper)'; a table without the paper's numbers has neither, nor 'sign = paper'). ± is the
    95% confidence interval over seeds; Δ is against base with the interval of the one test
    (`reports.significance`) in brackets, 'beyond noise' says whether it excludes zero (with the
    comparison's q over the family of comparisons), and 'PPL verdict since' when the row's PPL
    verdict was reached, as a share of training (`reports.trajectory`), flagged late or still moving."""
    pm = r" $\pm$ " if tex else " ± "
    paper = " (paper)" if has_paper(frame) else ""

    def ours_paper(mean: Any, half: Any, paper: Any, digits: int, paper_digits: int) -> str:
        text = _num(mean, digits)
        if text and half is not None and not pd.isna(half):
            text += pm + _num(half, digits)
        paper_text = _num(paper, paper_digits)
        return text + (f" ({paper_text})" if paper_text else "")

    def delta(r: pd.Series, metric: str, digits: int, with_paper: bool = True) -> str:
        text = _num(r.get(f"d_{metric}"), digits, "+")
        low, high = r.get(f"d_{metric}_low"), r.get(f"d_{metric}_high")
        if text and low is not None and not pd.isna(low):
            text += f" [{low:+.{digits}f}, {high:+.{digits}f}]"
        paper = r.get(f"d_paper_{metric}") if with_paper else None
        return text + (f" ({paper:+.{digits}f})" if text and paper is not None and not pd.isna(paper) else "")

    d = r"$\Delta$" if tex else "Δ"
    x6 = r"$\times 10^6$" if tex else "×10⁶"
    base = frame.attrs.get("base_configuration", {})
    table = pd.DataFrame.from_records([{
        "row": row, "changes from base": changes(r, base), "seeds": _seeds(r),
        f"PPL{paper}": ours_paper(r.ppl, r.get("ppl_ci"), r.paper_ppl, 2, 2),
        f"{d}PPL [95% CI]{paper}": delta(r, "ppl", 2),
        "PPL beyond noise": _beyond(r.get("beyond_noise"), r.get("ppl_q")),
        "PPL verdict since": _since(r),
        "sign = paper": {True: "yes", False: "no"}.get(r.get("ppl_sign_agrees"), ""),
        "converged": str(r.get("convergence") or ""),
        f"BLEU{paper}": ours_paper(r.bleu, r.get("bleu_ci"), r.paper_bleu, 2, 1),
        # (the paper's BLEU is in the column before: its Δ would widen the table past a window)
        f"{d}BLEU [95% CI]": delta(r, "bleu", 2, with_paper=False),
        "BLEU beyond noise": _beyond(r.get("bleu_beyond_noise"), r.get("bleu_q")),
        f"params {x6}{paper}": ours_paper(r.params_m, None, r.paper_params_m, 2, 0),
        "train s": _num(r.train_time_s, 0),
    } for row, r in frame.iterrows()])
    if not paper:
        table = table.drop(columns="sign = paper", errors="ignore")
    if "verdict_since_share" not in frame or frame["verdict_since_share"].isna().all():
        table = table.drop(columns="PPL verdict since")  # no curves compared
    if tex:
        table.columns = [c.replace("_", r"\_") if "$" not in c else c for c in table.columns]
        for column in ("PPL verdict since", "PPL beyond noise", "BLEU beyond noise"):
            if column in table:
                table[column] = table[column].str.replace("%", r"\%").str.replace("<", "$<$")
        table["changes from base"] = table["changes from base"].str.replace("_", r"\_")
    return table


def to_markdown(frame: pd.DataFrame) -> str:
    table = display_frame(frame)
    align = ["left" if c in ("row", "changes from base", "converged") else "right" for c in table.columns]
    return table.to_markdown(index=False, disable_numparse=True, colalign=align)


def to_latex(frame: pd.DataFrame, caption: str) -> str:
    return display_frame(frame, tex=True).to_latex(index=False, escape=False, caption=caption,
                                                   label="tab:table3")
