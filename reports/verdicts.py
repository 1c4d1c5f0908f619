"""One sentence per Table 3 group, built only from the table's columns, so that it can never say more
than the numbers beside it."""

from __future__ import annotations

import math

import pandas as pd

from reports.agreement import signs
from reports.significance import ALPHA, corrected, family_size
from reports.trajectory import LAST_SHARE, LATE_SHARE, percent

_BEYOND = {"ppl": "beyond_noise", "bleu": "bleu_beyond_noise"}

GROUP_TOPICS = {"A": "number of heads at constant compute", "B": "smaller key size d_k",
                "C": "model size (N, d_model, d_ff)", "D": "regularisation (dropout, label smoothing)",
                "E": "learned instead of sinusoidal positions", "big": "the big model",
                # ablations/modifications.yaml
                "normalisation": "pre-LN or RMSNorm instead of post-LN LayerNorm",
                "feed-forward": "GELU or a gated FFN instead of ReLU",
                "positions": "learned or rotary instead of sinusoidal positions",
                "embeddings": "untied or unscaled embeddings",
                "attention-heads": "fewer key/value heads (grouped- and multi-query attention)",
                "modern": "pre-LN, RMSNorm, SwiGLU and rotary positions together"}


def _row_phrase(row: str, r: pd.Series) -> str:
    change = f"{r.d_ppl:+.2f} PPL"
    if not math.isnan(r.get("d_ppl_low", math.nan)):
        change += f" [{r.d_ppl_low:+.2f}, {r.d_ppl_high:+.2f}]"
    if r.get("ci_method") == "base noise":
        change += " (one seed, assumed as noisy as base)"
    if pd.isna(r.get("d_paper_ppl")):
        return f"{row} {change}"
    agree = {True: ", same sign", False: ", opposite sign"}.get(r.get("ppl_sign_agrees"), "")
    return f"{row} {change} (paper {r.d_paper_ppl:+.2f}{agree})"


def group_verdict(frame: pd.DataFrame, group: str) -> str:
    """The sentence for one group (rows of `frame` whose group is `group`)."""
    rows = frame[frame["group"] == group]
    if rows.empty:
        return ""
    title = f"{group}, {GROUP_TOPICS[group]}" if group in GROUP_TOPICS else group  # yours: its name
    unconverged = [row for row, r in rows.iterrows() if r.get("convergence") not in (None, "converged")
                   and not pd.isna(r.get("convergence"))]
    beyond = rows[rows["beyond_noise"] == True]  # noqa: E712 (pandas: nullable booleans)
    within = [row for row in rows.index if row not in beyond.index]
    parts = []
    for word, sign in (("lower", -1), ("higher", 1)):
        if moved := [row for row, r in beyond.iterrows() if sign * r.d_ppl > 0]:
            parts.append(f"{word} PPL than base beyond noise: " + ", ".join(_row_phrase(row, beyond.loc[row]) for row in moved))
    open_ = [row for row in within if math.isnan(rows.loc[row].get("d_ppl_low", math.nan))]
    if inside := [row for row in within if row not in open_]:
        parts.append("within noise: " + ", ".join(inside))
    if open_:  # one seed on both sides; or base has one so far, and a row of several cannot be paired
        base_seeds = frame["seeds"].get("base", 0) if "seeds" in frame else 0
        parts.append(f"no interval ({'base has one seed' if base_seeds == 1 else 'one seed'}): " + ", ".join(open_))
    if "bleu_beyond_noise" in rows:
        bleu = rows[rows["bleu_beyond_noise"] == True]  # noqa: E712
        if len(bleu):
            parts.append("BLEU beyond noise: " + ", ".join(
                f"{row} {r.d_bleu:+.2f} [{r.d_bleu_low:+.2f}, {r.d_bleu_high:+.2f}]" for row, r in bleu.iterrows()))
    if lost := [f"{row} {name}" for metric, name in (("ppl", "PPL"), ("bleu", "BLEU"))
                for row, r in rows.iterrows()
                if r.get(_BEYOND[metric]) == True and not corrected(rows, metric)[row]]:  # noqa: E712
        parts.append(f"not beyond noise after correcting for the {family_size(frame)} comparisons "
                     f"(Benjamini–Hochberg, q < {ALPHA}): " + ", ".join(lost))
    comparable = rows["ppl_sign_agrees"].dropna()
    if len(comparable):
        parts.append(f"signs agree with the paper for {int(comparable.sum())} of {len(comparable)} rows "
                     "where the paper's difference is large enough to compare")
    if late := [row for row, r in rows.iterrows() if r.get("verdict_late") == True]:  # noqa: E712
        parts.append(f"late PPL verdict (held for less than {LATE_SHARE:.0%} of training): " + ", ".join(
            f"{row} since step {int(rows.loc[row, 'verdict_since_step']):,} ({percent(rows.loc[row, 'verdict_since_share'])}"
            + (", still moving over the last part of training)" if rows.loc[row].get("verdict_moving") == True  # noqa: E712
               else ")") for row in late))
    if unconverged:
        parts.append("not converged (read with care): " + ", ".join(
            f"{row} ({rows.loc[row].convergence})" for row in unconverged))
    return f"{title}: " + "; ".join(parts) + "."


def verdicts(frame: pd.DataFrame) -> dict[str, str]:
    """Group -> sentence for every group but base, in table order (none without a base result)."""
    if "beyond_noise" not in frame:
        return {}
    return {g: group_verdict(frame, g) for g in dict.fromkeys(frame["group"]) if g != "base"}


def _count(rows: pd.DataFrame, column: str, delta: str) -> tuple[int, int, int]:
    """(beyond noise, of them higher than base, lower) for one metric."""
    beyond = rows[rows[column] == True]  # noqa: E712
    return len(beyond), int((beyond[delta] > 0).sum()), int((beyond[delta] < 0).sum())


def headline(frame: pd.DataFrame) -> str | None:
    """The report's first sentence, counted from the table (docs/table3.md); None without base."""
    if "beyond_noise" not in frame or "base" not in frame.index:
        return None
    rows = frame.drop(index="base")
    late = rows["verdict_late"] == True if "verdict_late" in rows else pd.Series(False, index=rows.index)  # noqa: E712
    parts, kept = [], []
    for metric, delta, name in (("ppl", "d_ppl", "dev PPL"), ("bleu", "d_bleu", "dev BLEU")):
        column = _BEYOND[metric]
        if column not in rows:
            continue
        n, higher, lower = _count(rows, column, delta)
        text = f"{n} in {name} ({higher} higher, {lower} lower"
        if metric == "ppl" and late.any():
            text += f"; {int((late & (rows[column] == True)).sum())} of these verdicts late"  # noqa: E712
        parts.append(text + ")")
        if f"{metric}_q" in rows:
            kept.append(f"{int(corrected(rows, metric).sum())} in {name}")
    text = f"Beyond noise, {parts[0].replace(' in ', f' of the {len(rows)} rows differ from base in ', 1)}"
    text += "".join(f" and {part}" for part in parts[1:])
    if (open_ := int(rows["beyond_noise"].isna().sum())):
        text += f" ({open_} without an interval)"
    if kept:
        text += ", each comparison by its own 95% interval"
    if kept and (family := family_size(frame)):
        text += (f"; after correcting for all {family} comparisons (Benjamini–Hochberg, q < {ALPHA}), "
                 + " and ".join(kept))
    if agreement := signs(frame):
        text += f"; {agreement.sentence()}"
    if "convergence" in frame and frame["convergence"].notna().any():
        converged = int((frame["convergence"] == "converged").sum())
        text += f"; {converged} of the {len(frame)} rows (base included) pass the convergence rule"
    if "verdict_moving" in rows and rows["verdict_moving"].notna().any():
        moving = int((rows["verdict_moving"] == True).sum())  # noqa: E712
        text += (f"; the PPL verdict was reached late (held for less than {LATE_SHARE:.0%} of training) in "
                 f"{int(late.sum())} of the {int(rows['verdict_moving'].notna().sum())} rows judged, and is "
                 f"still moving over the last {LAST_SHARE:.0%} of evaluations in {moving}")
    return text + "."
