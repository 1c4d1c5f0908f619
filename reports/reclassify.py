"""Runs that recorded their convergence class under an older rule, classified again under the current one.

A run records its class under the rule of its day (`lightning_modules.convergence`, versioned). A
table trained over weeks can hold runs of two versions, and a finished trial cannot be changed.
Its run directory keeps the curves the rule reads, though, so the report applies the current rule
to each such run whose logs are on this machine: at the trial's `run_dir`, or where a redo set it
aside (`sweeps.redo`), found by its results.json (complete, the trial's dev PPL), and whose
config.yaml gives its warmup. The others keep the class they recorded, and the report says how
many.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from lightning_modules.convergence import ConvergenceRule, classify_run
from lightning_modules.run.results import RunResult, read_results
from sweeps.redo import set_aside


def rule_version(attrs: dict[str, Any]) -> int | None:
    """The version of the rule a trial's class was recorded under (None: no class recorded)."""
    if not attrs.get("convergence"):
        return None
    return int((attrs.get("convergence_rule") or {}).get("version", 1))


def finished_run(attrs: dict[str, Any], number: int) -> tuple[Path, RunResult] | None:
    """Trial `number`'s run directory on this machine and its results (None: not here)."""
    if not attrs.get("run_dir"):
        return None
    run_dir = Path(attrs["run_dir"])
    for place in (run_dir, *set_aside(run_dir, number)):
        done = read_results(place)
        if done is not None and done.status == "complete" and done.ppl == attrs.get("ppl"):
            return place, done
    return None


def reclassified(attrs: dict[str, Any], number: int) -> dict[str, Any] | None:
    """`convergence`, `convergence_reason` and `convergence_rule` under the current rule, for a trial
    that recorded an older one and whose logs are here (None otherwise)."""
    version = rule_version(attrs)
    if version is None or version >= ConvergenceRule.VERSION or (found := finished_run(attrs, number)) is None:
        return None
    place, done = found
    try:
        warmup = int(yaml.safe_load((place / "config.yaml").read_text(encoding="utf-8"))["train"]["warmup_steps"])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return None
    if done.unigram_ppl is None or not (place / "logs").is_dir():
        return None
    now = classify_run(place / "logs", done.unigram_ppl, warmup)
    return {key: now[key] for key in ("convergence", "convergence_reason", "convergence_rule")}
