"""Deterministic fault injection for the reliability tests: `ABLATE_FAULT=<point>[@<step>][:<SIGNAL>]`
makes the process send itself SIGNAL (SIGKILL by default) when it reaches `point` (at global step
`step`, where given). Points: `startup` (before any check: where SLURM's notice could kill it);
`train_step@N` (after step N and its checkpoint); `train_forward@N` (between step N's forward and
backward, where a Ctrl-C usually lands); `validation@N`; `compile` (inside compilation); `decode`
(the final beam search); `checkpoint_write@N`, `results_write` (the file whole, not yet renamed);
`nan_grad@N`, no signal: step N's gradients become NaN. With `:SIGSTOP` the process holds there
until a test has sent another signal and SIGCONT. Unset, this is one lookup per call."""

from __future__ import annotations

import os
import signal
import time

FAULT_ENV = "ABLATE_FAULT"
# A signal sent to a held process may reach another thread than the main one once continued, and
# Python's handler then runs a moment later: without a pause it would land in the next step.
HELD_SIGNALS_LAND_S = 0.5
POINTS = ("startup", "train_step", "train_forward", "validation", "compile", "decode", "checkpoint_write",
          "results_write", "nan_grad")


def _parse(spec: str) -> tuple[str, int | None, signal.Signals]:
    point, _, sig = spec.partition(":")
    point, _, step = point.partition("@")
    if point not in POINTS:
        raise ValueError(f"{FAULT_ENV}: unknown point {point!r} (one of {', '.join(POINTS)})")
    return point, int(step) if step else None, signal.Signals[sig or "SIGKILL"]


def inject(point: str, step: int | None = None) -> None:
    """Signal this process if `ABLATE_FAULT` names `point` (and `step`)."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    wanted, at, sig = _parse(spec)
    if wanted == point and (at is None or at == step):
        os.kill(os.getpid(), sig)
        if sig == signal.SIGSTOP:  # continued: let the signals sent while held land first
            time.sleep(HELD_SIGNALS_LAND_S)


def armed(point: str, step: int | None = None) -> bool:
    """Whether `ABLATE_FAULT` names `point` (and `step`): for the faults that are not a signal."""
    spec = os.environ.get(FAULT_ENV)
    return bool(spec) and _parse(spec)[:2] == (point, step)
