"""Did a run converge? One stated rule over its dev-perplexity and training-loss curves, so a report
can set apart the rows that measure optimisation accidents (`ConvergenceRule.describe()`;
docs/table3.md). Dev PPL spikes count, not only the loss's: a model collapsing towards the unigram
line can leave the loss nearly flat (a GPU base run's dev PPL nearly doubled while its loss rose by a
tenth). A report classifies each run again from the inputs it stored (`classify_stored`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_modules.metrics_log import logged

CLASSES = ("converged", "still improving", "overfitting", "unstable", "diverged", "unknown")
# what the rule reads, as a run stores it (results.json, the trial's user attributes)
INPUTS = ("dev_ppl_curve", "train_loss_curve", "unigram_ppl", "warmup_steps")
Curve = Sequence[tuple[int, float]]  # (step, value), steps ascending


@dataclass(frozen=True)
class ConvergenceRule:
    """The thresholds; `describe()` is the sentence reports print."""

    tail: float = 0.2  # the last fraction of training steps inspected
    tolerance: float = 0.01  # converged: dev PPL improved by less than this (relative) over the tail
    spike_ratio: float = 1.2  # unstable: a window's training loss above 1.2 x the best so far

    def describe(self) -> str:
        return (f"converged = dev PPL improved by less than {self.tolerance:.0%} over the last "
                f"{self.tail:.0%} of training steps; still improving = by more; unstable = after "
                f"warmup a dev PPL above the unigram PPL of the training targets, or a dev PPL or "
                f"window-mean training loss above {self.spike_ratio:g}× its best so far; overfitting = that dev "
                f"PPL rise while the training loss kept falling (no spike, and its mean over the last {self.tail:.0%} "
                f"more than {self.tolerance:.0%} below its mean over the evaluation interval ending at the dev "
                f"best); diverged = non-finite, "
                f"or ending after warmup at or above the unigram PPL; unknown = fewer than two dev evaluations "
                f"span the last {self.tail:.0%}")


@dataclass(frozen=True)
class Verdict:
    label: str  # one of CLASSES
    reason: str  # one sentence with the numbers behind the label
    tail_improvement: float | None = None  # relative dev-PPL improvement over the tail


def _finite(curve: Curve) -> bool:
    return all(math.isfinite(value) for _, value in curve)


def _first_spike(curve: Curve, warmup_steps: int, ratio: float) -> tuple[int, float, float] | None:
    """(step, value, best before it) of the first value after warmup above `ratio` × the best so far."""
    best = math.inf
    for step, value in curve:
        if step > warmup_steps and value > ratio * best:
            return step, value, best
        best = min(best, value)
    return None


def _loss_fell_since_best(dev_ppl: Curve, train_loss: Curve, rule: ConvergenceRule) -> tuple[float, float] | None:
    """(mean loss over the interval ending at the dev best, over the last `tail`) if it fell, else None."""
    best = min(range(len(dev_ppl)), key=lambda i: dev_ppl[i][1])
    since = dev_ppl[best - 1][0] if best else -math.inf
    last_step = dev_ppl[-1][0]
    at_best = [loss for step, loss in train_loss if since < step <= dev_ppl[best][0]]
    tail = [loss for step, loss in train_loss if last_step * (1 - rule.tail) < step <= last_step]
    if not at_best or not tail:
        return None
    means = sum(at_best) / len(at_best), sum(tail) / len(tail)
    return means if means[1] < means[0] * (1 - rule.tolerance) else None


def classify(dev_ppl: Curve, train_loss: Curve, unigram_ppl: float, warmup_steps: int,
             rule: ConvergenceRule = ConvergenceRule()) -> Verdict:
    """The class of one run from its dev-PPL curve and its window-mean training losses."""
    if not dev_ppl:
        return Verdict("unknown", "no dev evaluation was recorded")
    if not (_finite(dev_ppl) and _finite(train_loss)):
        return Verdict("diverged", "a non-finite training loss or dev perplexity")
    last_step, final = dev_ppl[-1]
    if final >= unigram_ppl and last_step > warmup_steps:
        return Verdict("diverged", f"final dev PPL {final:.4g} ≥ unigram PPL {unigram_ppl:.4g}")
    above = [(s, p) for s, p in dev_ppl if s > warmup_steps and p > unigram_ppl]
    if above:
        s, p = above[0]
        return Verdict("unstable", f"dev PPL {p:.4g} at step {s:,} (after warmup) above the unigram "
                                   f"PPL {unigram_ppl:.4g}")
    loss_spike = _first_spike(train_loss, warmup_steps, rule.spike_ratio)
    if spike := _first_spike(dev_ppl, warmup_steps, rule.spike_ratio):
        step, ppl, best = spike
        rose = f"dev PPL rose to {ppl:.4g} at step {step:,} (best so far {best:.4g})"
        if loss_spike is None and (fell := _loss_fell_since_best(dev_ppl, train_loss, rule)):
            return Verdict("overfitting", f"{rose} and ended at {final:.4g}, while the mean "
                                          f"training loss fell {fell[0]:.3g} → {fell[1]:.3g}")
        return Verdict("unstable", rose)
    if loss_spike:
        step, loss, best = loss_spike
        return Verdict("unstable", f"training loss spiked to {loss:.3g} at step {step:,} "
                                   f"(best so far {best:.3g})")
    tail_start = last_step * (1 - rule.tail)
    before = [(s, p) for s, p in dev_ppl if s <= tail_start]
    if not before or before[-1][0] == last_step:
        return Verdict("unknown", f"no dev evaluation at or before step {tail_start:,.0f} "
                                  f"(the start of the last {rule.tail:.0%})")
    start_step, start = before[-1]
    improvement = (start - final) / start
    span = f"from step {start_step:,} to {last_step:,}"
    if improvement < rule.tolerance:
        moved = "rose" if improvement < 0 else "improved"
        return Verdict("converged", f"dev PPL {moved} {abs(improvement):.1%} {span} "
                                    f"({start:.4g} → {final:.4g})", improvement)
    return Verdict("still improving", f"dev PPL improved {improvement:.1%} {span} "
                                      f"({start:.4g} → {final:.4g})", improvement)


def read_curves(log_dir: str | Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(dev PPL curve, window-mean training loss curve) from a run's logs (`metrics_log`)."""
    return sorted(logged(log_dir, "val/ppl").items()), sorted(logged(log_dir, "train/loss").items())


def rule_inputs(log_dir: str | Path, unigram_ppl: float, warmup_steps: int) -> dict[str, Any]:
    """What the rule reads of a run (`INPUTS`) from its logs, rounded as it is stored and classified."""
    dev, train = read_curves(log_dir)
    return {"dev_ppl_curve": [[step, round(ppl, 4)] for step, ppl in dev],
            "train_loss_curve": [[step, round(loss, 4)] for step, loss in train],
            "unigram_ppl": unigram_ppl, "warmup_steps": warmup_steps}


def classify_stored(inputs: Mapping[str, Any], rule: ConvergenceRule = ConvergenceRule()) -> Verdict | None:
    """The class of a run from the inputs it stored (`rule_inputs`); None when any lacks (unclassified)."""
    if any(inputs.get(key) is None for key in INPUTS):
        return None
    return _classify_inputs(inputs, rule)


def _classify_inputs(inputs: Mapping[str, Any], rule: ConvergenceRule) -> Verdict:
    dev = [(int(step), float(ppl)) for step, ppl in inputs["dev_ppl_curve"]]
    train = [(int(step), float(loss)) for step, loss in inputs["train_loss_curve"]]
    return classify(dev, train, float(inputs["unigram_ppl"]), int(inputs["warmup_steps"]), rule)


def classify_run(log_dir: str | Path, unigram_ppl: float, warmup_steps: int) -> dict[str, Any]:
    """What results.json stores of the rule: its inputs, and the class and reason they give."""
    inputs = rule_inputs(log_dir, unigram_ppl, warmup_steps)
    verdict = _classify_inputs(inputs, ConvergenceRule())
    return {**inputs, "convergence": verdict.label, "convergence_reason": verdict.reason}
