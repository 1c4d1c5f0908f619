"""The processes of a sweep and what they hand each other: `launch` starts workers
(`python -m sweeps.worker`, settings in $ABLATE_WORKER), a worker starts one trial process per
trial (`python -m sweeps.trial_run`, the job in $ABLATE_TRIAL_JOB), which exits EXIT_PRUNED when
pruned. The environment, not the command line, carries them: `ps` shows command lines to every
user, and the storage URL may hold a database password.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from pathlib import Path

from lightning_modules.run.slurm import REQUEUE_SIGNAL

WORKER_ENV = "ABLATE_WORKER"  # the worker's settings (JSON)
JOB_ENV = "ABLATE_TRIAL_JOB"  # a trial's job (JSON), read by sweeps.trial_run
EXIT_PRUNED = 3  # a trial process's exit status when its trial was pruned
INTERRUPTS = {signal.SIGINT, signal.SIGTERM}
HELD_AT_START = INTERRUPTS | {REQUEUE_SIGNAL}  # SLURM's pre-emption notice too


def die_with_parent() -> None:
    """In the child (Linux): get SIGKILL when the worker dies, so no orphan keeps training."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _start_child() -> None:
    """In the child, before it runs: it dies with its parent, and interrupts and SLURM's
    pre-emption notice wait (blocked, not lost) until it can handle them: an interrupt while
    Python starts would be a traceback, a notice (SIGUSR1) would kill it."""
    die_with_parent()
    signal.pthread_sigmask(signal.SIG_BLOCK, HELD_AT_START)
    # A sweep started as `nohup ablate ... &` from a script has SIGINT ignored, and an ignored
    # signal stays ignored across exec (Python then installs no KeyboardInterrupt for it). A child
    # that sets no SIGINT handler of its own would ignore the Ctrl-C it is stopped with: give it
    # the default back (blocked until it is ready).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class StopRequests:
    """SIGINT in a trial process: a KeyboardInterrupt as Python's own handler raises, and
    remembered. CPython drops an exception raised inside a weakref callback or `__del__` (it prints
    "Exception ignored in ..."), and the garbage collector runs those anywhere: a stop landing in one
    was lost, and the trial trained on until the worker killed it two minutes later (seen once in
    the kill cycles of `make test-slow`). `check()` raises it again where it is safe, and the
    dropped stop is one line in the trial's log, not CPython's traceback (`sys.unraisablehook`;
    other exceptions dropped there are printed as before)."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGINT, self.handler)
        previous = sys.unraisablehook

        def dropped(unraisable: "sys.UnraisableHookArgs") -> None:
            if self.requested and isinstance(unraisable.exc_value, KeyboardInterrupt):
                print("ablate: stop noted; it takes effect before the next training step", file=sys.stderr, flush=True)
            else:
                previous(unraisable)

        sys.unraisablehook = dropped

    def handler(self, signum: int, frame: object) -> None:
        self.requested = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise the stop asked for, if any (it may have been dropped where it was raised)."""
        if self.requested:
            raise KeyboardInterrupt


def accept_interrupts(notice: bool = False) -> None:
    """Deliver the interrupts held since the process started (and the pre-emption notice, with
    `notice`) to the handlers it has by now. A training process leaves the notice to
    `run.slurm.PreemptionNotice.install`."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HELD_AT_START if notice else INTERRUPTS)


def ignore_interrupts() -> None:
    """The process is done: an interrupt during its exit would only print a traceback."""
    for signum in INTERRUPTS:
        signal.signal(signum, signal.SIG_IGN)


def spawn(argv: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> subprocess.Popen:
    """A child process in its own session that dies with this process; it must call
    `accept_interrupts` once it handles SIGINT/SIGTERM."""
    out = open(log, "ab") if log else None  # noqa: SIM115 (closed when the child ends, below)
    try:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                start_new_session=True, preexec_fn=_start_child)
    finally:
        if out:
            out.close()
