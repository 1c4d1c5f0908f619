"""The processes of a sweep and what they hand each other, through the environment, not the command
line (`ps` shows it to every user, and a storage URL may hold a password)."""

from __future__ import annotations

import ctypes
import signal
import subprocess
from pathlib import Path

from foundation.stop import hold_stop_signals

WORKER_ENV = "ABLATE_WORKER"  # the worker's settings (JSON)
JOB_ENV = "ABLATE_TRIAL_JOB"  # a trial's job (JSON), read by sweeps.trial_run
EXIT_PRUNED = 3  # a trial process's exit status when its trial was pruned


def die_with_parent() -> None:
    """In the child (Linux): get SIGKILL when the worker dies, so no orphan keeps training."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _start_child() -> None:
    """In the child, before it runs: it dies with its parent; its stop signals wait until recorded."""
    die_with_parent()
    hold_stop_signals()


def spawn(argv: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen:
    """A child in its own session that dies with this process, its stop signals held until recorded."""
    out = open(log, "ab") if log else None  # noqa: SIM115 (closed when the child ends, below)
    try:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True, preexec_fn=_start_child)
    finally:
        if out:
            out.close()
