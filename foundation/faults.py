"""Deterministic fault injection: a real signal at a named point, for the reliability tests.

Set `ABLATE_FAULT=<point>[@<step>][:<SIGNAL>]` and the process sends itself SIGNAL (SIGKILL by
default) when it reaches `point` (at global step `step`, where given). Points:

- `startup`: as `ablate train` or `ablate table3` starts its work (before any check: the window
  in which SLURM's pre-emption notice could kill a process);
- `train_step@N`: after optimizer step N (its periodic checkpoint, if one is due, is written);
- `train_forward@N`: after the forward pass of step N, before its backward and optimizer step
  (where a Ctrl-C usually lands);
- `validation@N`: inside the validation run at step N;
- `compile`: inside torch.compile's compilation of the training step (after tracing, before
  code generation);
- `decode`: in the middle of the final beam search over the dev set;
- `checkpoint_write@N`: the checkpoint of step N written to its temporary file, not yet renamed;
- `results_write`: results.json written to its temporary file, not yet renamed;
- `nan_grad@N`: not a signal: the gradients of step N become NaN, so the weights and every later
  loss do (a numerical fault).

With `:SIGSTOP` the process holds itself at the point until a test has sent it another signal
(SLURM's pre-emption notice, `tests/test_slurm.py`) and SIGCONT. Unset (the normal case) this is
one dictionary lookup per call.
"""

from __future__ import annotations

import os
import signal
import time

FAULT_ENV = "ABLATE_FAULT"
# The kernel hands a signal sent to a stopped process to any of its threads once it is continued;
# when that is not the main thread, Python's handler runs only a moment after this one has gone on.
# Without a pause, SLURM's notice sent while held at step N would be handled in step N+1 now and then.
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
