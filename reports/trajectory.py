"""Verdicts over training (docs/table3.md): the row's dev PPL difference to base tested at every shared
dev evaluation (seed level); `rules()` says when a verdict was reached and whether it still moves."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from reports.significance import difference

LAST_SHARE = 0.2  # the last part of training the 'still moving' rule looks at (of the shared evaluations)
LATE_SHARE = 0.5  # a verdict held for less than this share of training is late


def rules() -> list[str]:
    """The two rules, one sentence each, as the report's methods state them."""
    return [f"Verdict reached (column 'PPL verdict since'; figures verdicts_*.png mark its step): at every dev "
            f"evaluation that a row and base both have, the row's dev PPL difference to base is read by the "
            f"table's test as beyond noise above base, below it, or within noise, and the row's verdict was "
            f"reached at the step from which that reading has been its final one at every such evaluation, "
            f"given as that step's share of training; a verdict held for less than {LATE_SHARE:.0%} of training "
            f"is late.",
            f"Verdict still moving: that reading is not the same at each of the last {LAST_SHARE:.0%} of those "
            f"evaluations (at least two); a row trained longer than base is compared only where base has "
            f"evaluations and is judged by neither rule."]


def on_grid(curve: pd.DataFrame, grid: list[int]) -> pd.DataFrame:
    """`curve`'s steps moved to `grid`'s nearest within 1% of its spacing; points farther off dropped."""
    if curve.empty or len(grid) < 2:
        return curve
    tolerance = 0.01 * float(np.median(np.diff(grid)))
    points = np.asarray(grid)
    nearest = [points[np.abs(points - step).argmin()] for step in curve["step"]]
    snapped = curve.assign(step=[int(g) if abs(g - s) <= tolerance else -1 for g, s in zip(nearest, curve["step"])])
    return snapped[snapped["step"] >= 0].drop_duplicates(["seed", "step"], keep="last")


def paired_curves(curves: pd.DataFrame, row: str) -> pd.DataFrame:
    """Per step the row and base share: the difference, its interval and verdict (+1, -1, 0, nan)."""
    records = []
    if curves.empty:
        return pd.DataFrame(columns=["step", "d", "low", "high", "verdict"])
    mine, base = curves[curves["row"] == row], curves[curves["row"] == "base"]
    mine = on_grid(mine, sorted(set(base["step"])))
    steps = set.intersection(*(set(part["step"]) for _, part in pd.concat([mine, base]).groupby(["row", "seed"]))) \
        if not mine.empty and not base.empty else set()
    ours = {step: dict(zip(part["seed"], part["ppl"])) for step, part in mine.groupby("step")}
    theirs = {step: dict(zip(part["seed"], part["ppl"])) for step, part in base.groupby("step")}
    for step in sorted(steps):
        test = difference(ours[step], theirs[step])
        i = test.interval
        verdict = math.nan if test.beyond_noise is None else (0 if not test.beyond_noise else (1 if i.mean > 0 else -1))
        records.append({"step": step, "d": i.mean, "low": i.low, "high": i.high, "verdict": verdict})
    return pd.DataFrame.from_records(records, columns=["step", "d", "low", "high", "verdict"])


def still_moving(paired: pd.DataFrame, own_last_step: float | None = None) -> bool | None:
    """Whether the verdict changed over the last `LAST_SHARE` of shared evaluations (None: not judged)."""
    if own_last_step is not None and len(paired) and paired["step"].max() < own_last_step:
        return None
    k = max(2, math.ceil(LAST_SHARE * len(paired)))
    last = paired["verdict"].tail(k)
    if len(last) < 2 or last.isna().any():
        return None
    return bool(last.nunique() > 1)


def reached(paired: pd.DataFrame, own_last_step: float | None = None) -> tuple[int, float] | None:
    """The step from which the final verdict has held, and its share of training (None: not judged)."""
    if still_moving(paired, own_last_step) is None or paired["verdict"].isna().any():
        return None
    verdicts, steps = paired["verdict"].tolist(), paired["step"].tolist()
    first = len(verdicts) - 1
    while first > 0 and verdicts[first - 1] == verdicts[-1]:
        first -= 1
    return int(steps[first]), steps[first] / steps[-1]


def percent(share: float) -> str:
    """A share of training in whole percent, never 100% short of the end (step 23,999 of 24,000: 99%)."""
    return f"{min(round(100 * share), 99) if share < 1 else 100}%"


def late(share: float) -> bool:
    """Whether a verdict reached at `share` of training has held for less than LATE_SHARE of it."""
    return 1 - share < LATE_SHARE


def add_moving(frame: pd.DataFrame, curves: pd.DataFrame) -> None:
    """Adds per row when its verdict was reached, whether late, whether still moving (`rules`)."""
    if curves is None or curves.empty or "base" not in frame.index:
        return
    for column in ("verdict_since_step", "verdict_since_share"):
        frame[column] = math.nan
    for column in ("verdict_late", "verdict_moving"):
        frame[column] = pd.Series(None, index=frame.index, dtype=object)
    for row in frame.index:
        if row == "base":
            continue
        own = curves.loc[curves["row"] == row, "step"].max() if (curves["row"] == row).any() else None
        paired = paired_curves(curves, row)
        frame.loc[row, "verdict_moving"] = still_moving(paired, own)
        if (since := reached(paired, own)) is not None:
            frame.loc[row, "verdict_since_step"], frame.loc[row, "verdict_since_share"] = since
            frame.loc[row, "verdict_late"] = late(since[1])
