"""Verdicts over training: has a row's verdict against base settled, or is it still moving?

At every dev evaluation that a row and base both have (the same step in every seed of both, within 1% of the evaluation interval), the
row's dev PPL difference to base is tested as the table's is (`reports.significance.difference`,
the seed level: a curve holds no per-sentence PPL), and read as a verdict: beyond noise above
base, beyond noise below, or within noise. A row's verdict is *still moving* when that verdict
is not the same at each of the last `LAST_SHARE` of those evaluations (at least two): a sign
beyond noise reversed, or the difference entered or left noise. This looks at the comparison;
the convergence rule looks at one run's curve alone. A row that trains longer than base (big) is
compared only where base has evaluations, which end before its own training does, so it is not
judged (None).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from reports.significance import difference

LAST_SHARE = 0.2  # the last part of training the rule looks at (of the shared evaluations)


def rule() -> str:
    return (f"a row's verdict is still moving when its dev PPL verdict against base (beyond noise above, "
            f"beyond noise below, or within noise, by the same test at each evaluation that it and base "
            f"both have) is not the same at each of the last {LAST_SHARE:.0%} of those evaluations "
            f"(at least two); a row trained longer than base is compared only where base has evaluations "
            f"and is not judged")


def on_grid(curve: pd.DataFrame, grid: list[int]) -> pd.DataFrame:
    """`curve` with each step moved to the nearest step of `grid` within 1% of the grid's usual
    spacing (a resumed run may evaluate a step or two off base's), points farther off dropped."""
    if curve.empty or len(grid) < 2:
        return curve
    tolerance = 0.01 * float(np.median(np.diff(grid)))
    points = np.asarray(grid)
    nearest = [points[np.abs(points - step).argmin()] for step in curve["step"]]
    snapped = curve.assign(step=[int(g) if abs(g - s) <= tolerance else -1 for g, s in zip(nearest, curve["step"])])
    return snapped[snapped["step"] >= 0].drop_duplicates(["seed", "step"], keep="last")


def paired_curves(curves: pd.DataFrame, row: str) -> pd.DataFrame:
    """Per evaluation step that the row and base share in every seed: the difference to base with
    its interval and verdict (+1 above, -1 below, 0 within noise, nan without an interval)."""
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
    """Whether the verdict changed over the last `LAST_SHARE` of the shared evaluations (None: too
    few evaluations with an interval, or the row trains past base's last evaluation)."""
    if own_last_step is not None and len(paired) and paired["step"].max() < own_last_step:
        return None
    k = max(2, math.ceil(LAST_SHARE * len(paired)))
    last = paired["verdict"].tail(k)
    if len(last) < 2 or last.isna().any():
        return None
    return bool(last.nunique() > 1)


def add_moving(frame: pd.DataFrame, curves: pd.DataFrame) -> None:
    """Adds `verdict_moving` to the frame: whether each row's verdict against base is still moving
    (`still_moving` of its paired curve; the figures draw that curve themselves)."""
    if curves is None or curves.empty or "base" not in frame.index:
        return
    for row in frame.index:
        if row == "base":
            frame.loc[row, "verdict_moving"] = None
            continue
        own = curves.loc[curves["row"] == row, "step"].max() if (curves["row"] == row).any() else None
        frame.loc[row, "verdict_moving"] = still_moving(paired_curves(curves, row), own)
